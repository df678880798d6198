"""The launcher's pure decision (jobplane.decide.launch) as tables: a claimed job, what the launcher read and
what the cloud answered so far in; the next step out. No cloud, no registry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobplane.boot.agent_bundle import Variant
from jobplane.decide.launch import Claim, Fail, Launch, LaunchSnapshot, Refused, Step, Tried, Wait, claim, decide
from jobplane.decide.rules import LaunchCause
from jobplane.model import images
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import Policy
from jobplane.model.spec import JobSpec
from jobplane.model.states import State

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
X86 = Variant("aws", "3.12", images.X86_64, "0" * 64, 1)
ARM = Variant("aws", "3.12", images.AARCH64, "1" * 64, 1)
UBUNTU_X86 = images.resolve("aws", images.DEFAULT_CPU, "t3.micro")
UBUNTU_ARM = images.resolve("aws", images.DEFAULT_CPU, "c7g.large")


def record(*, state: State = State.LAUNCHING, attempt: int = 1, restarts: int = 0, waits: int = 0,
           age: timedelta = timedelta(minutes=5), **spec: Any) -> JobRecord:
    spec = {"instance_type": "t3.micro", **spec}
    return JobRecord(id="j", spec=JobSpec(id="j", run="python3 train.py", **spec), state=state, attempt=attempt,
                     restarts=restarts, waits=waits, created_at=NOW - age, updated_at=NOW, state_since=NOW)


@pytest.mark.parametrize("seen, want", [
    pytest.param(dict(state=State.QUEUED, attempt=0), Claim(attempt=1, restarts=0, reason="launching attempt 1"),
                 id="first launch"),
    pytest.param(dict(state=State.PREEMPTED, attempt=1), Claim(attempt=2, restarts=1, reason="launching attempt 2"),
                 id="rerun after a preemption"),
    pytest.param(dict(state=State.LAUNCHING, attempt=2, restarts=1),
                 Claim(attempt=3, restarts=2, reason="launching attempt 3"), id="boot retry"),
    pytest.param(dict(state=State.WAITING_CAPACITY, attempt=1), Claim(attempt=1, restarts=0,
                 reason="launching attempt 1"), id="a capacity wait keeps its attempt"),
    pytest.param(dict(state=State.WAITING_CAPACITY, attempt=0), Claim(attempt=1, restarts=0,
                 reason="launching attempt 1"), id="a wait before any attempt starts attempt 1"),
])
def test_a_claim_bumps_the_attempt_unless_it_ends_a_wait(seen: dict[str, Any], want: Claim) -> None:
    job = record(**seen)
    assert claim(job, expect={job.state}, expect_attempt=job.attempt) == want


@pytest.mark.parametrize("seen, expect, expect_attempt, why", [
    pytest.param(dict(state=State.RUNNING, attempt=1), {State.PREEMPTED}, 1,
                 "state RUNNING attempt 1, expected PREEMPTED attempt 1", id="moved on"),
    pytest.param(dict(state=State.PREEMPTED, attempt=2), {State.PREEMPTED}, 1,
                 "state PREEMPTED attempt 2, expected PREEMPTED attempt 1", id="rerun by another run"),
])
def test_a_claim_of_a_job_that_is_not_as_seen_is_refused(seen: dict[str, Any], expect: set[State],
                                                         expect_attempt: int, why: str) -> None:
    assert claim(record(**seen), expect=expect, expect_attempt=expect_attempt) == Refused(why)


def test_a_claim_carries_the_callers_reason() -> None:
    job = record(state=State.WAITING_CAPACITY)
    assert claim(job, expect={job.state}, expect_attempt=1, reason="capacity wait over: retrying") == \
        Claim(attempt=1, restarts=0, reason="capacity wait over: retrying")


def no_capacity(instance_type: str, zone: str | None = None) -> Tried:
    return Tried(instance_type, zone, f"no {instance_type}")


GPU_ZONES = dict(instance_type=["g5.xlarge", "g6.xlarge"], zones=["us-east-1a", "us-east-1b"])
ALL_FULL = tuple(no_capacity(t, z) for t in ("g5.xlarge", "g6.xlarge") for z in ("us-east-1a", "us-east-1b"))
ALL_FULL_ERROR = "; ".join(f"{t} in {z}: no {t}" for t in ("g5.xlarge", "g6.xlarge")
                           for z in ("us-east-1a", "us-east-1b"))
NO_CAPACITY = "no capacity in any zone or instance type"


def full(waits: int, minutes: int) -> Wait:
    """The wait after every candidate was full: the `waits`-th in a row, for `minutes`."""
    return Wait(NO_CAPACITY, ALL_FULL_ERROR, waits, NOW + timedelta(minutes=minutes), cause=LaunchCause.NO_CAPACITY)


QUOTA = ("owner 'default' has 63 active instances; 2 more would exceed the quota of 64 "
         "(max_active_instances_per_owner)")


@pytest.mark.parametrize("job, seen, want", [
    pytest.param(dict(), dict(), Launch("t3.micro", None, UBUNTU_X86, images.X86_64), id="one type, any zone"),
    pytest.param(GPU_ZONES, dict(),
                 Launch("g5.xlarge", "us-east-1a", images.resolve("aws", images.DEFAULT_GPU, "g5.xlarge"),
                        images.X86_64), id="the first candidate"),
    pytest.param(GPU_ZONES, dict(tried=ALL_FULL[:1]),
                 Launch("g5.xlarge", "us-east-1b", images.resolve("aws", images.DEFAULT_GPU, "g5.xlarge"),
                        images.X86_64), id="no capacity: the next zone"),
    pytest.param(GPU_ZONES, dict(tried=ALL_FULL[:2]),
                 Launch("g6.xlarge", "us-east-1a", images.resolve("aws", images.DEFAULT_GPU, "g6.xlarge"),
                        images.X86_64), id="no capacity in any zone: the next type"),
    pytest.param(dict(instance_type="c7g.large", image="ubuntu-24.04"), dict(agents=(X86, ARM)),
                 Launch("c7g.large", None, UBUNTU_ARM, images.AARCH64), id="an alias resolved for Graviton"),
    pytest.param(dict(instance_type="t3.micro", image="ami-0123456789abcdef0"), dict(),
                 Launch("t3.micro", None, "ami-0123456789abcdef0", images.X86_64), id="a raw image as given"),
    pytest.param(GPU_ZONES, dict(tried=ALL_FULL), full(1, 1),
                 id="every candidate full: a minute's wait"),
    pytest.param(dict(**GPU_ZONES, waits=3), dict(tried=ALL_FULL),
                 full(4, 8), id="the wait doubles per try"),
    pytest.param(dict(**GPU_ZONES, waits=9), dict(tried=ALL_FULL),
                 full(10, 30), id="the wait is capped"),
    pytest.param(dict(**GPU_ZONES, waits=5, max_wait="1h", age=timedelta(minutes=50)), dict(tried=ALL_FULL),
                 full(6, 10), id="the wait ends at max_wait"),
    pytest.param(dict(**GPU_ZONES, max_wait="1h", age=timedelta(hours=1)), dict(tried=ALL_FULL),
                 Fail(f"{NO_CAPACITY} within max_wait 1h: {ALL_FULL_ERROR}", LaunchCause.MAX_WAIT),
                 id="max_wait spent: failed"),
    pytest.param(dict(num_nodes=2), dict(over_quota=QUOTA), Wait(QUOTA, QUOTA, 1, NOW + timedelta(minutes=1),
                                                                 cause=LaunchCause.OVER_QUOTA),
                 id="over the owner's quota: a wait"),
    pytest.param(dict(num_nodes=2, max_wait="1h", age=timedelta(hours=2)), dict(over_quota=QUOTA),
                 Fail(f"{QUOTA} within max_wait 1h: {QUOTA}", LaunchCause.MAX_WAIT),
                 id="over the quota past max_wait: failed"),
    pytest.param(dict(), dict(agents=(), agent_problem="agent/manifest.json is missing"),
                 Fail("no agent bundle in this deployment: agent/manifest.json is missing; deploy it (cdk deploy, "
                      "or make gcp-package and terraform apply)", LaunchCause.NO_AGENT), id="no agent manifest"),
    pytest.param(dict(instance_type=["t3.micro", "c7g.large"]), dict(tried=(no_capacity("t3.micro"),)),
                 Fail("instance_type: c7g.large is an aarch64 type and this deployment has no aws agent bundle "
                      "for aarch64", LaunchCause.NO_AGENT), id="no agent bundle for the next type's architecture"),
    pytest.param(GPU_ZONES, dict(tried=(Tried("g5.xlarge", "us-east-1a", "bad AMI", rejected=True),)),
                 Fail("the cloud refused g5.xlarge in us-east-1a: bad AMI", LaunchCause.REJECTED),
                 id="refused outright: failed"),
])
def test_each_step_of_a_launch(job: dict[str, Any], seen: dict[str, Any], want: Step) -> None:
    snap = LaunchSnapshot(record(**job), Policy(), **{"agents": (X86,), **seen})
    assert decide(snap, NOW) == want


def test_the_cloud_answers_fed_back_walk_the_candidates_then_wait() -> None:
    snap = LaunchSnapshot(record(**GPU_ZONES), Policy(), agents=(X86,))
    walked = []
    while isinstance(step := decide(snap, NOW), Launch):
        walked.append((step.instance_type, step.zone))
        snap = snap.after(no_capacity(step.instance_type, step.zone))
    assert walked == [(t.instance_type, t.zone) for t in ALL_FULL]
    assert step == full(1, 1)
