"""The reconcilers on the local cloud: real moto, bootstrap, agents and instance processes, and the real
handlers fired by the local cloud's trigger loop. Every test asserts job states from the registry and
instances from EC2 (moto).

One local cloud serves the module. Jobs that need nothing from a test (a runaway, a silent hang, a jobless
and an untagged instance) and jobs that only wait to be acted on start up front, so their timeouts run
while the other tests work.
"""

from __future__ import annotations

import json
import re
import threading
from datetime import UTC, datetime

import pytest

from jobplane import keys, reconcile
from jobplane.clouds.aws import Ec2Compute
from jobplane.clouds.aws_local import LocalAws, RawInstance
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID
from jobplane.clouds.s3 import S3Store
from jobplane.decide.model import Rule
from jobplane.local.demo import CloudProcess, exit_report
from jobplane.registry import JobNotFound, JobRecord, Registry, utcnow
from jobplane.states import State
from jobplane.telemetry import CountingMetrics
from tests.helpers import wait_for
from tests.local.conftest import cli_ok, submit, write_spec

pytestmark = pytest.mark.scenario
TICKING = "while true; do echo tick; sleep 1; done"  # prints, never ends
CKPT = re.compile(r"(?:^|/)ckpt-(\d+)\.npz$")


@pytest.fixture(scope="module", autouse=True)
def started(cloud: CloudProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Job ids (and two hand-made instance ids) of everything started up front."""
    specs = tmp_path_factory.mktemp("specs")
    jobs = {
        "runaway": write_spec(specs, "runaway", TICKING, max_runtime="60s", owner="runaway"),
        "hang": write_spec(specs, "hang", "echo loading; sleep 3600", stall_timeout="10s", owner="hang"),
        "no-restarts": write_spec(specs, "no-restarts", TICKING, max_restarts="0", owner="no-restarts"),
        "pair": write_spec(specs, "pair", 'while true; do echo "rank $NODE_RANK tick"; sleep 1; done',
                           num_nodes="2", owner="pair"),
        "overlap": write_spec(specs, "overlap", TICKING, owner="overlap"),
    }
    ids = {name: submit(cloud, spec) for name, spec in jobs.items()}
    ids["orphan"] = cli_ok(cloud, "local", "instance").strip()
    ids["untagged"] = cli_ok(cloud, "local", "instance", "--unmanaged").strip()
    return ids


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


def running_with_output(cloud: CloudProcess, reg: Registry, job_id: str, timeout: float = 120) -> JobRecord:
    """RUNNING, and the user process has printed (so its agent is up and watching IMDS)."""
    record = wait_state(reg, job_id, {State.RUNNING}, timeout)
    wait_for(f"output of {job_id}", lambda: any(b.job_id == job_id and b.output for b in reg.heartbeats()), 30, 0.5)
    return record


def cancel(cloud: CloudProcess, job_id: str) -> None:
    """Free the local cloud's CPU for the next test; the module's finalizer checks nothing is left."""
    cloud.cli("cancel", job_id, "--force")


# ---- preemption --------------------------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_preempted_spot_job_syncs_its_checkpoint_and_resumes_from_it_on_attempt_2(cloud, tmp_path):
    reg = cloud.registry()
    spec = write_spec(tmp_path, "resume", "python3 train.py --steps 300 --checkpoint-every 25 --sleep 0.05",
                      max_restarts="2", owner="resume")
    job_id = submit(cloud, spec)
    first = wait_state(reg, job_id, {State.RUNNING}, 120)
    wait_for("a checkpoint in the bucket",
             lambda: any(CKPT.search(k) for k, _, _ in reg.listing(keys.checkpoints_prefix(job_id))), 60, 0.2)

    cli_ok(cloud, "local", "preempt", job_id, "--grace", "15")
    report = wait_for("attempt 1's exit report", lambda: exit_report(reg, job_id, 1), 60, 0.2)
    synced = {int(m.group(1)): at for k, at, _ in reg.listing(keys.checkpoints_prefix(job_id)) if (m := CKPT.search(k))}
    assert report["reason"] == "preempted" and report["notice"]["action"] == "terminate"
    wait_gone(cloud, first.instances)  # the agent powered off after its report, or EC2 reclaimed it at the notice
    assert max(synced.values()) <= terminated_at(cloud, first.instances[0]), "checkpoints synced before the end"
    assert powered_off(cloud, first.instances[0])
    resumed_from = max(synced)
    assert 0 < resumed_from < 300

    done = wait_state(reg, job_id, {State.SUCCEEDED, State.FAILED}, 150)
    assert done.state == State.SUCCEEDED, done.reason
    assert done.attempt == 2 and done.restarts == 1
    assert "starting from step 0" in logs(cloud, job_id, 1)
    second = logs(cloud, job_id, 2)
    assert f"resuming from step {resumed_from} " in second
    steps = [int(s) for s in re.findall(r"^step (\d+) loss", second, re.M)]
    assert steps[0] == resumed_from + 1 and steps[-1] == 300
    assert {n: len(v) for n, v in by_attempt(cloud, job_id).items()} == {1: 1, 2: 1}
    wait_gone(cloud, [i.id for i in instances_of(cloud, job_id)])


@pytest.mark.timeout(180)
def test_preempted_job_without_restarts_left_fails(cloud, started):
    reg, job_id = cloud.registry(), started["no-restarts"]
    record = running_with_output(cloud, reg, job_id)
    cli_ok(cloud, "local", "preempt", job_id, "--grace", "5")

    failed = wait_state(reg, job_id, {State.FAILED, State.LAUNCHING, State.SUCCEEDED}, 60)
    assert failed.state == State.FAILED and "no restarts left" in (failed.reason or "")
    assert failed.attempt == 1 and failed.restarts == 0
    assert exit_report(reg, job_id, 1)["reason"] == "preempted"
    wait_gone(cloud, record.instances)
    assert list(by_attempt(cloud, job_id)) == [1], "no second attempt was launched"
    assert job_id not in reg.preempted()


@pytest.mark.timeout(180)
def test_killed_rank_of_a_two_node_job_tears_the_attempt_down_and_reruns_it(cloud, started):
    reg, job_id = cloud.registry(), started["pair"]
    first = running_with_output(cloud, reg, job_id)
    assert len(first.instances) == 2
    killed = cli_ok(cloud, "local", "kill", job_id, "--rank", "1").split()
    assert killed == [first.instances[1]]

    wait_for("attempt 2", lambda: reg.job(job_id).attempt == 2, 90, 0.5)
    wait_gone(cloud, first.instances)  # rank 0 survived the kill: the sweeper tore it down
    lost = [e for e in reg.events(job_id) if e.get("to") == State.PREEMPTED]
    assert len(lost) == 1 and "Spot capacity lost: rank 1" in lost[0]["reason"]
    second = wait_state(reg, job_id, {State.RUNNING}, 90)  # both ranks of attempt 2 are up and beating
    assert second.attempt == 2 and second.restarts == 1 and len(second.instances) == 2
    assert sorted(i.id for i in by_attempt(cloud, job_id)[2]) == sorted(second.instances)
    assert all(state_of(cloud, i) == "running" for i in second.instances)
    cancel(cloud, job_id)


@pytest.mark.timeout(180)
def test_five_overlapping_rerun_invocations_launch_exactly_one_attempt(cloud, started):
    reg, job_id = cloud.registry(), started["overlap"]
    first = running_with_output(cloud, reg, job_id)
    # Five invocations, each with its own clients as separate Lambdas would have; they race with the local
    # cloud's own rerun (fired by the same preempted-jobs/ marker) as well.
    invocations = []
    for _ in range(5):
        aws = LocalAws(cloud.state["AWS_REGION"], cloud.state["AWS_ENDPOINT_URL"], cloud.state)
        invocations.append((Registry(S3Store(cloud.settings.bucket, aws.s3)),
                            Ec2Compute(reg.policy().aws, cloud.state["AWS_REGION"], aws.ec2)))
    go = threading.Event()
    results: list[list[reconcile.Outcome]] = []

    def invoke(reg_: Registry, compute: Ec2Compute) -> None:
        go.wait(90)
        results.append(reconcile.rerun(reg_, compute, now=utcnow(), metrics=CountingMetrics(), jobs=[job_id],
                                       policy=reg_.policy()))

    threads = [threading.Thread(target=invoke, args=pair) for pair in invocations]
    for t in threads:
        t.start()
    try:
        cli_ok(cloud, "local", "preempt", job_id, "--grace", "5")
        wait_for("the preempted-jobs/ marker", lambda: job_id in reg.preempted(), 60, 0.05)
    finally:
        go.set()
        for t in threads:
            t.join(60)

    assert len(results) == 5
    outcomes = [o for r in results for o in r]
    assert not [o for o in outcomes if o.result == reconcile.Result.ERROR], outcomes
    reruns = [o.result for o in outcomes if o.action.rule == Rule.RERUN]
    assert reruns, "the invocations ran while the marker was pending"
    assert reruns.count(reconcile.Result.APPLIED) <= 1, reruns
    assert set(reruns) <= {reconcile.Result.APPLIED, reconcile.Result.SKIPPED}, reruns
    wait_for("attempt 2", lambda: reg.job(job_id).attempt == 2, 60, 0.5)
    wait_for("the marker to be cleared", lambda: job_id not in reg.preempted(), 30, 0.5)
    wait_gone(cloud, first.instances)
    record = reg.job(job_id)
    assert record.attempt == 2 and record.restarts == 1 and record.state in (State.LAUNCHING, State.RUNNING)
    launched = by_attempt(cloud, job_id)
    assert sorted(launched) == [1, 2] and len(launched[2]) == 1 and launched[2][0].id == record.instances[0]
    claims = [e["attempt"] for e in reg.events(job_id) if e.get("to") == State.LAUNCHING and e["from"] != e["to"]]
    assert claims == [1, 2], "one claim per attempt"
    cancel(cloud, job_id)


# ---- uptime cap, stall, orphans ----------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_runaway_job_gets_a_stop_request_and_ends_timed_out(cloud, started):
    reg, job_id = cloud.registry(), started["runaway"]
    done = wait_state(reg, job_id, {State.TIMED_OUT, State.FAILED, State.STALLED, State.SUCCEEDED}, 150)
    assert done.state == State.TIMED_OUT and "uptime cap" in (done.reason or "") and "1m" in done.reason, done.reason
    stop = reg.get_json(keys.stop_request(job_id))
    assert stop["by"] == "uptime-cap" and "stop requested" in stop["reason"]
    assert exit_report(reg, job_id, 1)["reason"] == "stopped", "the agent stopped the job before the cap"
    wait_gone(cloud, done.instances)
    assert powered_off(cloud, done.instances[0])


@pytest.mark.timeout(150)
def test_user_process_that_hangs_silently_is_stalled_and_terminated(cloud, started):
    reg, job_id = cloud.registry(), started["hang"]
    done = wait_state(reg, job_id, {State.STALLED, State.FAILED, State.TIMED_OUT, State.SUCCEEDED}, 120)
    # Heartbeats kept coming (the agent was fine); the user process printed nothing new.
    assert done.state == State.STALLED and "no new output" in (done.reason or ""), done.reason
    assert "loading" in logs(cloud, job_id, 1)
    wait_gone(cloud, done.instances)


@pytest.mark.timeout(120)
def test_jobless_managed_instance_is_terminated_and_an_untagged_one_is_untouched(cloud, started):
    orphan, untagged = started["orphan"], started["untagged"]
    wait_gone(cloud, [orphan], 90)
    sweeps = cloud_invocations(cloud, "sweeper")
    wait_for("two more sweeps", lambda: cloud_invocations(cloud, "sweeper") >= sweeps + 2, 30, 0.5)
    assert state_of(cloud, untagged) == "running"
    assert untagged not in {i.id for i in cloud.instances()}, "the untagged instance is not managed"


def cloud_invocations(cloud: CloudProcess, function: str) -> int:
    return int(json.loads(cli_ok(cloud, "local", "status"))["invocations"].get(function, 0))
