"""Retries on errors (the spec's retry:), pure: decide.retry's verdict, the check's rules that consult it, and the
launcher's claim that counts a retry apart from restarts. No I/O anywhere in this file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from jobplane.decide import check
from jobplane.decide.effects import Relaunch
from jobplane.decide.launch import Claim, claim
from jobplane.decide.model import ExitReport, Rule
from jobplane.decide.retry import Trigger, Verdict, exit_code, verdict
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import IdleGpuPolicy, Policy
from jobplane.model.states import State
from tests.decide.helpers import NOW, POLICY, beats, healthy, inst, marker, record, report, snapshot

ALL = {"max": 2, "on_exit_codes": [42, 43], "on_lost": True, "on_stalled": True}


def rec(retries: int = 0, retry: dict[str, Any] | None = None, **kw: Any) -> JobRecord:
    return record(retry=ALL if retry is None else retry, **kw).model_copy(update={"retries": retries})


# ---- the verdict -----------------------------------------------------------------------------------------------
@dataclass
class VerdictCase:
    name: str
    rec: JobRecord
    trigger: Trigger
    want: Verdict | None
    reports: tuple[ExitReport, ...] = ()
    policy: Policy = POLICY
    stop_asked: bool = False


VERDICTS = [
    VerdictCase("no retry: in the spec -> the error stands", record(), Trigger.EXIT_CODE, None),
    VerdictCase("max 0 is off", rec(retry={**ALL, "max": 0}), Trigger.LOST, None),
    VerdictCase("a trigger the spec does not name", rec(retry={"max": 2, "on_exit_codes": [42]}), Trigger.STALLED,
                None),
    VerdictCase("on_lost false", rec(retry={"max": 2, "on_stalled": True}), Trigger.LOST, None),
    VerdictCase("first retry", rec(), Trigger.EXIT_CODE, Verdict(True, 1, 2)),
    VerdictCase("second retry", rec(retries=1), Trigger.STALLED, Verdict(True, 2, 2)),
    VerdictCase("retries used up", rec(retries=2), Trigger.LOST,
                Verdict(False, because="no retries left (retry.max 2)")),
    VerdictCase("restarts used up do not matter", rec(restarts=3, max_restarts=3), Trigger.LOST, Verdict(True, 1, 2)),
    VerdictCase("the policy's attempts used up", rec(retries=1, attempt=3, restarts=1), Trigger.EXIT_CODE,
                Verdict(False, because="attempt 3 was the last the policy allows (max_attempts_per_job 3)"),
                policy=Policy(max_attempts_per_job=3)),
    VerdictCase("max_wait spent", rec(created=7201, max_wait=7200), Trigger.EXIT_CODE,
                Verdict(False, because="max_wait 2h exceeded")),
    VerdictCase("inside the uptime cap's stop window (cap 1h, grace 6m)", rec(launched=3600 - 360, max_runtime=3600),
                Trigger.LOST, Verdict(False, because="attempt 1 was at its uptime cap (1h)")),
    VerdictCase("just before the stop window", rec(launched=3600 - 361, max_runtime=3600), Trigger.LOST,
                Verdict(True, 1, 2)),
    VerdictCase("a rank stopped on a stop_on match", rec(), Trigger.LOST, None,
                reports=(report(0, 42, "early-stop"),)),
    VerdictCase("a rank stopped on a stop request", rec(), Trigger.STALLED, None, reports=(report(0, 143, "stopped"),)),
    VerdictCase("idle GPUs asked it to stop", rec(), Trigger.LOST, None, stop_asked=True),
]


@pytest.mark.parametrize("case", VERDICTS, ids=[c.name for c in VERDICTS])
def test_verdict(case: VerdictCase) -> None:
    assert verdict(case.rec, case.trigger, case.reports, NOW, case.policy, stop_asked=case.stop_asked) == case.want


def test_the_reason_says_why_and_what_came_of_it() -> None:
    assert Verdict(True, 1, 2).reason("exit code 42 (rank 0)", 1) == \
        "retry 1 of 2: exit code 42 (rank 0); relaunching as attempt 2"
    assert Verdict(False, because="no retries left (retry.max 2)").reason("rank 0 exited with code 42", 3) == \
        "rank 0 exited with code 42; not retried: no retries left (retry.max 2)"


def test_exit_code_is_the_lowest_rank_that_exited_on_its_own_with_a_listed_code() -> None:
    spec = rec().spec
    assert exit_code(spec, [report(1, 43), report(0, 1), report(2, 42)]) == report(1, 43)
    assert exit_code(spec, [report(0, 1), report(1, 42, "stopped"), report(2, 42, "early-stop")]) is None
    assert exit_code(record().spec, [report(0, 42)]) is None, "no retry: in the spec"


# ---- the check's rules ------------------------------------------------------------------------------------------
@dataclass
class SweepCase:
    name: str
    rec: JobRecord
    rule: Rule
    to: State | None
    reason: str
    exits: tuple[ExitReport, ...] = ()
    parts: dict[str, Any] | None = None  # listings; healthy() for the record's nodes if unset
    policy: Policy = POLICY
    idle_flagged: bool = False
    terminate: tuple[str, ...] | None = None


GONE: dict[str, Any] = {**healthy(), "instances": ()}
QUIET: dict[str, Any] = {**healthy(), "beats": tuple(beats(out=1801))}
STOPPING = Policy(idle_gpu=IdleGpuPolicy(action="stop"))

SWEEPS = [
    SweepCase("exit 42 -> retry", rec(), Rule.RETRY, None, "retry 1 of 2: exit code 42 (rank 0); relaunching as "
              "attempt 2", exits=(report(0, 42),)),
    SweepCase("exit 42 while LAUNCHING (finished before a check saw it run) -> retry", rec(state=State.LAUNCHING),
              Rule.RETRY, None, "retry 1 of 2: exit code 42 (rank 0); relaunching as attempt 2",
              exits=(report(0, 42),)),
    SweepCase("exit 1 -> FAILED, no rerun", rec(), Rule.FINISHED, State.FAILED, "rank 0 exited with code 1",
              exits=(report(0, 1),)),
    SweepCase("exit 0 -> SUCCEEDED", rec(), Rule.FINISHED, State.SUCCEEDED, "every rank exited 0",
              exits=(report(0, 0),)),
    SweepCase("exit 42, retries used up -> FAILED saying so", rec(retries=2), Rule.FINISHED, State.FAILED,
              "rank 0 exited with code 42; not retried: no retries left (retry.max 2)", exits=(report(0, 42),)),
    SweepCase("rank 1 of 2 exits 43 while rank 0 runs -> retry, rank 0 terminated", rec(nodes=2), Rule.RETRY, None,
              "retry 1 of 2: exit code 43 (rank 1); relaunching as attempt 2", exits=(report(1, 43),),
              parts=healthy(nodes=2), terminate=("i-j-1-0", "i-j-1-1")),
    SweepCase("rank 0 exits 1, rank 1 exits 42 (the collective broke) -> retry", rec(nodes=2), Rule.RETRY, None,
              "retry 1 of 2: exit code 42 (rank 1); relaunching as attempt 2", exits=(report(0, 1), report(1, 42)),
              parts=healthy(nodes=2)),
    SweepCase("stop_on match, code 42 -> FAILED, never retried", rec(), Rule.EARLY_STOP, State.FAILED,
              "stopped: train:loss became nan", exits=(report(0, 42, "early-stop", "train:loss became nan"),)),
    SweepCase("rank 1 exits 42 after rank 0's stop_on match -> FAILED, never retried", rec(nodes=2), Rule.EARLY_STOP,
              State.FAILED, "stopped: a stop_on rule matched (rank 0)",
              exits=(report(0, 1, "early-stop"), report(1, 42))),
    SweepCase("... while rank 2 still runs -> FAILED, never retried", rec(nodes=3), Rule.RANK_FAILED, State.FAILED,
              "rank 1 exited with code 42; ending the attempt (terminating rank 2)",
              exits=(report(0, 1, "early-stop"), report(1, 42)),
              parts={**healthy(nodes=3), "instances": (inst(rank=2),)}),
    SweepCase("the uptime cap's stop, code 42 -> TIMED_OUT, never retried", rec(), Rule.STOPPED, State.TIMED_OUT,
              "stopped at the uptime cap (1d)", exits=(report(0, 42, "stopped", stopped_by="uptime-cap"),)),
    SweepCase("an idle-GPU stop -> STALLED, never retried", rec(), Rule.IDLE_STOPPED, State.STALLED,
              "stopped for idle GPUs: idle_gpu", exits=(report(0, 143, "stopped", stopped_by="idle-gpu"),)),
    SweepCase("on-demand VM vanished, on_lost -> retry", rec(), Rule.RETRY, None,
              "retry 1 of 2: lost: rank 0 (i-j-1-0) vanished; relaunching as attempt 2", parts=GONE),
    SweepCase("on-demand VM vanished, no on_lost -> FAILED as ever", rec(retry={"max": 2, "on_exit_codes": [42]}),
              Rule.LOST, State.FAILED, "lost: rank 0 (i-j-1-0) vanished", parts=GONE),
    SweepCase("VM vanished in its uptime cap's stop window (its backstop shutdown) -> FAILED, not retried",
              rec(max_runtime=900), Rule.LOST, State.FAILED,
              "lost: rank 0 (i-j-1-0) vanished; not retried: attempt 1 was at its uptime cap (15m)", parts=GONE),
    SweepCase("VM vanished after an idle-GPU stop request -> FAILED, not retried", rec(), Rule.LOST, State.FAILED,
              "lost: rank 0 (i-j-1-0) vanished", parts=GONE, policy=STOPPING, idle_flagged=True),
    SweepCase("an idle-GPU flag without a stop request does not matter", rec(), Rule.RETRY, None,
              "retry 1 of 2: lost: rank 0 (i-j-1-0) vanished; relaunching as attempt 2", parts=GONE,
              idle_flagged=True),
    SweepCase("Spot VM vanished -> PREEMPTED (a restart, not a retry)", rec(spot=True), Rule.LOST_SPOT,
              State.PREEMPTED, "Spot capacity lost: rank 0 (i-j-1-0) gone", parts=GONE),
    SweepCase("stalled, on_stalled -> retry, its VM terminated", rec(), Rule.RETRY, None,
              "retry 1 of 2: stalled: no new output for 1801s (stall_timeout 30m); relaunching as attempt 2",
              parts=QUIET, terminate=("i-j-1-0",)),
    SweepCase("stalled, retries used up -> STALLED saying so", rec(retries=2), Rule.STALLED, State.STALLED,
              "no new output for 1801s (stall_timeout 30m); not retried: no retries left (retry.max 2)", parts=QUIET),
]


@pytest.mark.parametrize("case", SWEEPS, ids=[c.name for c in SWEEPS])
def test_sweep(case: SweepCase) -> None:
    parts = case.parts if case.parts is not None else healthy(nodes=case.rec.spec.num_nodes)
    if case.rec.state != State.RUNNING:
        parts = {**parts, "active": {"j": (marker(state=case.rec.state),)}, "limits": ()}
    flags = frozenset({("j", 1)}) if case.idle_flagged else frozenset()
    snap = snapshot(parts, records=[case.rec], exits={"j": list(case.exits)}, idle_flags=flags)
    (action,) = [a for a in check.decide(snap, NOW, case.policy) if a.rule not in (Rule.REPAIR, Rule.CLEANUP)]
    assert (action.rule, action.to) == (case.rule, case.to), action.reason
    assert action.reason == case.reason
    assert action.get(Relaunch) == (Relaunch(retry=True) if case.rule == Rule.RETRY else None)
    assert action.expect == {case.rec.state} and action.expect_attempt == 1, "applied only to the attempt it saw"
    if case.terminate is not None:
        assert action.terminate == case.terminate


# ---- the launcher's claim ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("seen", "retry", "want"), [
    pytest.param(dict(state=State.RUNNING, attempt=1, restarts=0), True, Claim(2, 0, "r", retries=1),
                 id="RUNNING -> LAUNCHING, a retry"),
    pytest.param(dict(state=State.LAUNCHING, attempt=2, restarts=1), True, Claim(3, 1, "r", retries=2),
                 id="LAUNCHING -> LAUNCHING, a retry: restarts untouched"),
    pytest.param(dict(state=State.LAUNCHING, attempt=2, restarts=1), False, Claim(3, 2, "r", retries=1),
                 id="a boot retry after a retry: a restart, retries untouched"),
    pytest.param(dict(state=State.WAITING_CAPACITY, attempt=2, restarts=0), False, Claim(2, 0, "r", retries=1),
                 id="the retried attempt waits for capacity: same attempt, nothing counted"),
])
def test_the_claim_counts_a_retry_apart_from_restarts(seen: dict[str, Any], retry: bool, want: Claim) -> None:
    job = rec(retries=1 if seen["attempt"] > 1 else 0, **seen)
    assert claim(job, expect={job.state}, expect_attempt=job.attempt, reason="r", retry=retry) == want
