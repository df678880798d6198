"""Scenarios on the local GCP cloud: the GCS and Compute Engine fakes, the real startup-scripts (bootstrap and
agent), shutdown-scripts and Cloud Functions entry points (through functions-framework), and the CLI on gs://.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from jobplane.agent.process import marked_pids
from jobplane.local.demo import CloudProcess, wait_for_no_instances
from jobplane.model.states import State
from tests.helpers import wait_for
from tests.local.conftest import cli_ok, shell_code, submit, write_spec
from tests.local.queue_scenario import run_team_queue

pytestmark = pytest.mark.scenario
SHARES_CLOUDS = ("gcp",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs
GCP = {"cloud": "gcp", "instance_type": "e2-standard-2"}


@pytest.mark.timeout(300)
def test_cancel_force_deletes_the_vm_while_the_sweeper_reaps_an_orphan_and_spares_a_foreign_vm(
        gcp: CloudProcess, tmp_path) -> None:
    orphan = cli_ok(gcp, "local", "instance").strip()  # managed, no job: reaped after the orphan grace
    foreign = cli_ok(gcp, "local", "instance", "--unmanaged").strip()  # not ours: never touched
    # runs until it is stopped; a shell line, so its VM installs nothing (examples/train's numpy)
    job_id = submit(gcp, write_spec(tmp_path, "long-run", '"while true; do echo tick; sleep 0.5; done"', **GCP),
                    shell_code(tmp_path))
    reg = gcp.registry()
    wait_for("the job to run", lambda: reg.exists(job_id) and reg.job(job_id).state == State.RUNNING, 120)
    (vm,) = reg.job(job_id).instances
    marker = f"JOBPLANE_LOCAL_INSTANCE={vm}"
    wait_for("the job's process", lambda: len(marked_pids(marker)) >= 2, 60)

    cancelled = gcp.cli("cancel", job_id, "--force")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"{job_id} CANCELLED\n" and cancelled.stderr == f"terminated {vm}\n"
    wait_for("every process of the VM to end", lambda: not marked_pids(marker), 90)
    assert reg.job(job_id).state == State.CANCELLED

    wait_for("the orphan to be reaped", lambda: orphan not in {i.id for i in gcp.vms()}, 120)
    assert not wait_for_no_instances(gcp, 60)
    status = json.loads(cli_ok(gcp, "local", "status"))
    assert status["cloud"] == "gcp" and status["errors"] == {}, status
    described = json.loads(cli_ok(gcp, "describe", job_id, "--json"))
    assert described["job"]["state"] == "CANCELLED" and described["instances"] == []
    zone, name = foreign.split("/")
    url = f"{gcp.state['JOBPLANE_COMPUTE_ENDPOINT']}/compute/v1/projects/jobplane-local/zones/{zone}/instances/{name}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as response:  # not a managed VM: no listing of ours shows it
        assert json.loads(response.read())["status"] == "RUNNING", "the unmanaged VM was touched"
    # deleted as its owner would, so the cloud can go on to another module quiet (conftest.Kept)
    opener.open(urllib.request.Request(url, method="DELETE"), timeout=30).close()


@pytest.mark.timeout(180)
def test_a_team_s_six_jobs_launch_by_priority_fifo_and_dependency_two_at_a_time(gcp: CloudProcess, tmp_path) -> None:
    run_team_queue(gcp, tmp_path, **GCP)
