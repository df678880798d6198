"""Scenarios on the local GCP cloud: the GCS and Compute Engine fakes, the real startup-scripts (bootstrap and
agent), shutdown-scripts and Cloud Functions entry points (through functions-framework), and the CLI on gs://.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from jobplane.local.demo import CloudProcess, wait_for_no_instances
from jobplane.local.runner import marked_pids
from jobplane.states import State
from tests.helpers import wait_for
from tests.local.conftest import cli_ok, run_demo, submit, write_spec

pytestmark = pytest.mark.scenario
GCP = {"cloud": "gcp", "instance_type": "e2-standard-2"}


@pytest.mark.timeout(900)
def test_demo_every_step_on_gcp(gcp: CloudProcess) -> None:
    """What `make demo CLOUD=gcp` runs: GCE's own maxRunDuration with the uptime-cap function paused, the happy
    path, a preemption resumed on attempt 2, the functions' uptime cap; and what the console said meanwhile."""
    console, verbs = run_demo(gcp)
    assert {"launched", "booted", "running", "preempted", "rerun", "capped", "finished", "deleted"} <= verbs, console
    # VM names start with jobplane-<6 hex of the deployment's sha256>-
    assert re.search(r"capped +us-central1-\w/jobplane-[0-9a-f]{6}-demo-max-run-\S+ \(.*\): maxRunDuration reached",
                     console)
    assert '"severity"' not in console, "function logs reached the console"
    functions_log = (gcp.state_dir / "functions.log").read_text()
    entries = [json.loads(line) for line in functions_log.splitlines() if line.startswith('{"severity"')]
    assert any(said.get("result") == "launched" for e in entries
               for said in e.get("result", {}).get("outcomes", []))  # the bucket-event function's
    assert any(e.get("metric") == "SweepDuration" for e in entries)


@pytest.mark.timeout(300)
def test_cancel_force_deletes_the_vm_while_the_sweeper_reaps_an_orphan_and_spares_a_foreign_vm(
        gcp: CloudProcess, tmp_path) -> None:
    orphan = cli_ok(gcp, "local", "instance").strip()  # managed, no job: reaped after the orphan grace
    foreign = cli_ok(gcp, "local", "instance", "--unmanaged").strip()  # not ours: never touched
    job_id = submit(gcp, write_spec(tmp_path, "long-run", "python3 train.py --steps 100000 --sleep 0.05", **GCP))
    reg = gcp.registry()
    wait_for("the job to run", lambda: reg.exists(job_id) and reg.job(job_id).state == State.RUNNING, 120)
    (vm,) = reg.job(job_id).instances
    marker = f"JOBPLANE_LOCAL_INSTANCE={vm}"
    wait_for("the training process", lambda: len(marked_pids(marker)) >= 2, 60)

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
