"""The reconcilers on the local cloud, for what only real processes show: an agent that syncs its checkpoint
when its Spot VM is reclaimed and a next attempt that resumes from it (one job, whose TensorBoard scalars of both
attempts `jobplane tensorboard` then serves), and an agent that honours the uptime
cap's stop request and powers its VM off. Real moto, bootstrap, agents and instance processes, and the real
handlers fired by the local cloud's trigger loop. The reconcilers' decisions over time (stalls, orphans,
lost ranks, reruns, exhausted restarts, overlapping runs) are told in memory in tests/control/reconcile/test_day.py.

One local cloud serves the module. The runaway job starts up front, so its cap runs out while the other test
works.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobplane.cli.tensorboard import free_port
from jobplane.clouds.aws_local import RawInstance
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID
from jobplane.decide.rules import Rule
from jobplane.local.demo import REPO, CloudProcess, exit_report
from jobplane.local.package_index import wheel_dir
from jobplane.model import keys
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import State
from jobplane.store.registry import JobNotFound, Registry
from tests.helpers import wait_for
from tests.local.conftest import cli_ok, paced, shell_code, submit, write_spec

pytestmark = pytest.mark.scenario
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs
TICKING = "while true; do echo tick; sleep 1; done"  # prints, never ends
CKPT = re.compile(r"(?:^|/)step\.json$")  # examples/tensorboard's checkpoint


@pytest.fixture(scope="module", autouse=True)
def runaway(cloud: CloudProcess, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The id of a job that prints for ever under a 40 s cap (its stop request comes 4 s before: the grace is at most
    a tenth of the cap), started up front."""
    specs = tmp_path_factory.mktemp("specs")
    return submit(cloud, write_spec(specs, "runaway", TICKING, max_runtime="40s", owner="runaway"), shell_code(specs))


# ---- helpers -----------------------------------------------------------------------------------------------
def wait_state(reg: Registry, job_id: str, states: set[State], timeout: float) -> JobRecord:
    def reached() -> bool:
        try:
            return reg.job(job_id).state in states
        except JobNotFound:
            return False  # still in queue/: the launcher has not taken it yet

    wait_for(f"{job_id} to reach {'/'.join(sorted(states))}", reached, timeout, 0.5)
    return reg.job(job_id)


def instances_of(cloud: CloudProcess, job_id: str) -> list[RawInstance]:
    """Every instance EC2 ever started for the job, in any state."""
    return [i for i in cloud.instances() if i.tags.get(TAG_JOB_ID) == job_id]


def by_attempt(cloud: CloudProcess, job_id: str) -> dict[int, list[RawInstance]]:
    out: dict[int, list[RawInstance]] = {}
    for i in instances_of(cloud, job_id):
        out.setdefault(int(i.tags[TAG_ATTEMPT]), []).append(i)
    return out


def state_of(cloud: CloudProcess, instance_id: str) -> str:
    return next(i.state for i in cloud.instances(managed_only=False) if i.id == instance_id)


def terminated_at(cloud: CloudProcess, instance_id: str) -> datetime:
    """When EC2 (moto) terminated it, from StateTransitionReason "User initiated (YYYY-mm-dd HH:MM:SS UTC)"."""
    (res,) = cloud.aws().ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    stamp = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC\)", res["Instances"][0]["StateTransitionReason"])
    assert stamp, res["Instances"][0]["StateTransitionReason"]
    return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def gone(cloud: CloudProcess, instance_ids: list[str]) -> bool:
    return all(state_of(cloud, i) in ("shutting-down", "terminated") for i in instance_ids)


def wait_gone(cloud: CloudProcess, instance_ids: list[str], timeout: float = 45) -> None:
    wait_for(f"{instance_ids} to be terminated", lambda: gone(cloud, instance_ids), timeout, 0.5)


def powered_off(cloud: CloudProcess, instance_id: str) -> bool:
    """The instance's agent called `shutdown -h now`: the runner's shim recorded it (the real one never runs)."""
    power_log = cloud.state_dir / "instances" / instance_id / "power.log"
    return power_log.exists() and any(line.split()[1:] == ["shutdown", "-h", "now"]
                                      for line in power_log.read_text().splitlines())


def logs(cloud: CloudProcess, job_id: str, attempt: int) -> str:
    return cli_ok(cloud, "logs", job_id, "--attempt", str(attempt))


# ---- preemption ----------------------------------------------------------------------------------------------
def scalars(url: str, run: str, tag: str) -> list[int] | None:
    """The steps of a run's scalars, as TensorBoard's scalars plugin answers them; None while it does not."""
    query = urllib.parse.urlencode({"run": run, "tag": tag})
    try:
        with urllib.request.urlopen(f"{url}data/plugin/scalars/scalars?{query}", timeout=5) as answer:
            return [int(step) for _, step, _ in json.load(answer)]
    except (OSError, ValueError):
        return None


def served_scalars(cloud: CloudProcess, job_id: str, runs: Path) -> tuple[list[int], list[int]]:
    """`jobplane tensorboard JOB`'s loss steps of attempts 1 and 2; checks TensorBoard stops with the command."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    served = subprocess.Popen([sys.executable, "-m", "jobplane.cli", "tensorboard", job_id, "--port", str(port),
                               "--dir", str(runs)], env=cloud.env, cwd=REPO, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = wait_for("TensorBoard's scalars of attempt 1", lambda: scalars(url, f"{job_id}/attempt-1", "loss"), 60,
                         0.5, abort=lambda: None if served.poll() is None else f"exited {served.returncode}")
        second = wait_for("and of attempt 2", lambda: scalars(url, f"{job_id}/attempt-2", "loss"), 30, 0.5)
    finally:
        served.terminate()  # the command stops TensorBoard too; should it not, its session goes
        try:
            served.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(served.pid, signal.SIGKILL)
            served.wait()
    assert served.returncode == 0, served.stderr.read() if served.stderr else ""
    with pytest.raises(ConnectionRefusedError):  # TensorBoard stopped with the command
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    return first, second


@pytest.mark.timeout(300)
def test_a_preempted_spot_job_syncs_its_checkpoint_resumes_from_it_and_tensorboard_serves_both_attempts(
        cloud, tmp_path):
    """One job proves both (it was two, a VM pair each): examples/tensorboard checkpoints its step (step.json,
    written aside and renamed, as examples/train writes its ckpt-N.npz) and logs its loss to TensorBoard."""
    pytest.importorskip("tensorboard", reason="jobplane tensorboard serves with the tensorboard package (dev extra)")
    if not any(wheel_dir().glob("tensorboardx-*.whl")):
        pytest.skip(f"no tensorboardX in the local package index ({wheel_dir()}): run `make local-index`")
    reg = cloud.registry()
    spec = write_spec(tmp_path, "resume", paced("python3 train.py --steps 150 --checkpoint-every 10", 0.12, 0.04),
                      max_restarts="2", owner="resume", tensorboard="{log_dir: /opt/ml/output/tensorboard}")
    job_id = submit(cloud, spec, REPO / "examples" / "tensorboard")
    first = wait_state(reg, job_id, {State.RUNNING}, 120)
    checkpoints = keys.checkpoints_prefix(first.data)

    def synced() -> list[tuple[int, datetime]]:
        """Attempt 1's synced step.json versions: the step each holds, and when it was written."""
        return [(json.loads(reg.get_bytes(k))["step"], at) for k, at, _ in reg.listing(checkpoints + "files/")
                if CKPT.search(k) and "-a1/" in k]

    wait_for("attempt 1's events and a checkpoint in the bucket", lambda: any(
        True for _ in reg.listing(keys.tensorboard_prefix(first.data, 1))) and synced(), 60, 0.2)
    cli_ok(cloud, "local", "preempt", job_id, "--grace", "15")
    report = wait_for("attempt 1's exit report", lambda: exit_report(reg, job_id, 1), 60, 0.2)
    assert report["reason"] == "preempted" and report["notice"]["action"] == "terminate"
    wait_gone(cloud, first.instances)  # the agent powered off after its report, or EC2 reclaimed it at the notice
    saved = synced()
    assert max(at for _, at in saved) <= terminated_at(cloud, first.instances[0]), "checkpoints synced before the end"
    assert powered_off(cloud, first.instances[0])
    resumed_from = max(step for step, _ in saved)
    assert 0 < resumed_from < 150

    done = wait_state(reg, job_id, {State.SUCCEEDED, State.FAILED}, 150)
    assert done.state == State.SUCCEEDED, done.reason
    assert done.attempt == 2 and done.restarts == 1
    assert "starting from step 0" in logs(cloud, job_id, 1)
    second = logs(cloud, job_id, 2)
    assert re.search(rf"^resuming from step {resumed_from}$", second, re.M), second[:500]
    steps = [int(s) for s in re.findall(r"^step (\d+) loss", second, re.M)]
    assert steps[0] == resumed_from + 1 and steps[-1] == 150
    assert {n: len(v) for n, v in by_attempt(cloud, job_id).items()} == {1: 1, 2: 1}
    wait_gone(cloud, [i.id for i in instances_of(cloud, job_id)])

    board_1, board_2 = served_scalars(cloud, job_id, tmp_path / "runs")
    # attempt 1's points from step 1, whole, up to where the preemption cut it (its writer thread's last record may
    # lag the checkpoint it saved: 39 against 40 on a loaded machine)
    assert board_1 == list(range(1, board_1[-1] + 1)) and board_1[-1] < 150
    assert board_2 == list(range(resumed_from + 1, 151))  # the second attempt from its checkpoint to the end, whole


# ---- uptime cap --------------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_runaway_job_gets_a_stop_request_and_ends_timed_out(cloud, runaway):
    reg, job_id = cloud.registry(), runaway
    done = wait_state(reg, job_id, {State.TIMED_OUT, State.FAILED, State.STALLED, State.SUCCEEDED}, 150)
    # the agents' stop at the cap (STOPPED) or the cap itself, if its run came first (TIMED_OUT)
    assert (done.state, done.cause, done.reason) in {(State.TIMED_OUT, Rule.STOPPED, "stopped at the uptime cap (40s)"),
                                                     (State.TIMED_OUT, Rule.TIMED_OUT, "uptime cap 40s reached")}, done
    stop = reg.get_json(keys.stop_request(job_id))
    assert stop["by"] == "uptime-cap" and "stop requested" in stop["reason"]
    assert exit_report(reg, job_id, 1)["reason"] == "stopped", "the agent stopped the job before the cap"
    wait_gone(cloud, done.instances)
    assert powered_off(cloud, done.instances[0])
