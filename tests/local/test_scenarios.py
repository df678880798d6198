"""Scenarios on the local cloud: real moto, real bootstrap and agent processes, the real handlers."""

from __future__ import annotations

import json

import pytest

from jobplane.agent.process import marked_pids
from jobplane.local.demo import wait_for_no_instances
from jobplane.model import keys
from jobplane.model.states import State
from tests.helpers import wait_for
from tests.local.conftest import shell_code, submit, write_spec
from tests.local.queue_scenario import run_team_queue

pytestmark = pytest.mark.scenario
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs
# runs until it is stopped; a shell line, so its VM installs nothing (examples/train's numpy)
FOREVER = '"while true; do echo tick; sleep 0.5; done"'


@pytest.mark.timeout(120)
def test_invalid_spec_dropped_into_queue_is_rejected_and_listed_invalid(cloud):
    reg = cloud.registry()
    # `aws s3 cp bad.yaml s3://BUCKET/queue/bad-drop.yaml`: no CLI validation in the way
    reg.store.put(keys.queue_entry("bad-drop"), b"name: bad\ninstance_type: t3.micro\nnum_nodes: 0\n")
    # the launcher records the rejection before it deletes the drop (a crash between loses nothing): both, then
    wait_for("rejected/bad-drop.error.json and the drop gone",
             lambda: (any(k == keys.rejected_error("bad-drop") for k, _, _ in reg.listing(keys.REJECTED))
                      and not [k for k, _, _ in reg.listing(keys.QUEUE) if "bad-drop" in k]), 60)
    assert keys.rejected_spec("bad-drop") in [k for k, _, _ in reg.listing(keys.REJECTED)]

    listed = cloud.cli("ls", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r["id"] == "bad-drop")
    assert row["state"] == "INVALID"
    assert "num_nodes" in row["reason"] and "run" in row["reason"]
    table = cloud.cli("ls", "--all")
    assert any("bad-drop" in line and "INVALID" in line for line in table.stdout.splitlines()), table.stdout


@pytest.mark.timeout(180)
def test_cancel_running_job_ends_cancelled_with_its_process_gone(cloud, tmp_path):
    job_id = submit(cloud, write_spec(tmp_path, "long-run", FOREVER), shell_code(tmp_path))
    reg = cloud.registry()
    wait_for("the job to run", lambda: reg.exists(job_id) and reg.job(job_id).state == State.RUNNING, 90)
    instance_id = reg.job(job_id).instances[0]
    marker = f"JOBPLANE_LOCAL_INSTANCE={instance_id}"
    wait_for("the job's process", lambda: len(marked_pids(marker)) >= 2, 30)

    cancelled = cloud.cli("cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "CANCELLED" in cancelled.stdout
    assert reg.job(job_id).state == State.CANCELLED

    wait_for("every process of the instance to end", lambda: not marked_pids(marker), 90)
    assert not wait_for_no_instances(cloud, 120)
    exit_report = reg.get_json(keys.exit_report(job_id, 1, 0))
    assert exit_report["reason"] == "stopped"
    assert reg.job(job_id).state == State.CANCELLED  # nothing moved it on afterwards

    again = cloud.cli("cancel", job_id)
    assert again.returncode == 1 and "already CANCELLED" in again.stderr
    assert "Traceback" not in again.stderr


@pytest.mark.timeout(180)
def test_cancel_right_after_submit_ends_cancelled_with_nothing_left_running(cloud, tmp_path):
    """Whether the launcher has taken the job yet or not: CANCELLED, and no instance survives."""
    job_id = submit(cloud, write_spec(tmp_path, "short-lived", FOREVER), shell_code(tmp_path))
    cancelled = cloud.cli("cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"{job_id} CANCELLED")
    waited = cloud.cli("wait", job_id, "--timeout", "60s")
    assert waited.returncode == 3 and f"job {job_id} CANCELLED" in waited.stderr, waited.stderr
    left = wait_for_no_instances(cloud, 120)
    assert not left, f"still running 120 s after the cancel: {left}"
    assert cloud.registry().job(job_id).state == State.CANCELLED


@pytest.mark.timeout(60)
def test_unknown_job_is_one_clear_line(cloud):
    for command in (["describe", "no-such-job"], ["logs", "no-such-job"], ["logs", "no-such-job", "-f"],
                    ["cancel", "no-such-job"], ["wait", "no-such-job"]):
        result = cloud.cli(*command)
        assert result.returncode == 1, command
        assert result.stderr.strip() == "Error: no job 'no-such-job'", command


@pytest.mark.timeout(180)
def test_a_team_s_six_jobs_launch_by_priority_fifo_and_dependency_two_at_a_time(cloud, tmp_path):
    run_team_queue(cloud, tmp_path)
