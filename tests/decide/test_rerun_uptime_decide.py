"""Rerun and uptime-cap decisions, table-driven, pure."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from jobplane.decide import rerun, uptime
from jobplane.decide.effects import ClearPreempted, Note, Relaunch, RequestStop, Terminate, Transition
from jobplane.decide.model import Action, PreemptedMark, Rule, Snapshot
from jobplane.model.history import IgnoredFact
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import Policy
from jobplane.model.states import LIVE, State
from tests.decide.helpers import (
    NOW,
    POLICY,
    ago,
    healthy,
    inst,
    limits,
    marker,
    policy,
    record,
    snapshot,
    unmarked,
)


# ---- rerun ---------------------------------------------------------------------------------------------------
@dataclass
class RerunCase:
    name: str
    rec: JobRecord | None
    mark_attempt: int | None
    rule: Rule
    to: State | None = None
    relaunch: bool = False
    reason: str = ""
    iid: str | None = None  # the instance the marker names; else rank 0's of mark_attempt
    listed: tuple[str, ...] = ()  # instances of attempt 1 in the cloud's listing


RERUNS = [
    RerunCase("PREEMPTED with restarts left -> relaunch, then clear", record(state=State.PREEMPTED, spot=True),
              mark_attempt=1, rule=Rule.RERUN, to=None, relaunch=True, reason="preempted; rerun as attempt 2"),
    RerunCase("RUNNING reported by the agent -> PREEMPTED, relaunch", record(spot=True), mark_attempt=1,
              rule=Rule.RERUN, to=State.PREEMPTED, relaunch=True),
    RerunCase("marker of a RUNNING job without an attempt -> ignored, cleared, an event", record(spot=True),
              mark_attempt=None, rule=Rule.IGNORED,
              reason="ignored preempted marker: names i-j-None-0 of attempt None, not an instance of attempt 1"),
    RerunCase("marker naming another job's instance -> ignored, cleared, an event", record(spot=True), mark_attempt=1,
              rule=Rule.IGNORED, iid="i-other-1-0",
              reason="ignored preempted marker: names i-other-1-0 of attempt 1, not an instance of attempt 1"),
    RerunCase("marker naming an instance the cloud lists for the attempt (not in job.json yet) -> relaunch",
              record(spot=True, instances=[]), mark_attempt=1, rule=Rule.RERUN, to=State.PREEMPTED, relaunch=True,
              listed=("i-j-1-0",)),
    RerunCase("marker naming an instance gone from the listing but in job.json -> relaunch", record(spot=True),
              mark_attempt=1, rule=Rule.RERUN, to=State.PREEMPTED, relaunch=True),
    RerunCase("the sweeper's re-mark of a PREEMPTED job names no instance -> relaunch",
              record(state=State.PREEMPTED, spot=True), mark_attempt=1, rule=Rule.RERUN, to=None, relaunch=True,
              iid=""),
    RerunCase("LAUNCHING reclaimed before it beat -> PREEMPTED, relaunch", record(state=State.LAUNCHING, spot=True),
              mark_attempt=1, rule=Rule.RERUN, to=State.PREEMPTED, relaunch=True),
    RerunCase("no restarts left -> FAILED", record(state=State.PREEMPTED, spot=True, attempt=4, restarts=3),
              mark_attempt=4, rule=Rule.RERUN_EXHAUSTED, to=State.FAILED, relaunch=False,
              reason="preempted; no restarts left (max_restarts 3)"),
    RerunCase("max_restarts 0 -> FAILED at the first preemption", record(spot=True, max_restarts=0), mark_attempt=1,
              rule=Rule.RERUN_EXHAUSTED, to=State.FAILED),
    RerunCase("max_wait spent -> FAILED", record(state=State.PREEMPTED, spot=True, created=7201, max_wait=7200),
              mark_attempt=1, rule=Rule.RERUN_EXHAUSTED, to=State.FAILED, relaunch=False,
              reason="preempted; max_wait 2h exceeded"),
    RerunCase("attempt already rerun (marker left by a crash) -> clear", record(state=State.LAUNCHING, attempt=2),
              mark_attempt=1, rule=Rule.CLEAR, reason="attempt 1 already rerun as 2"),
    RerunCase("job ended -> clear", record(state=State.CANCELLED), mark_attempt=1, rule=Rule.CLEAR,
              reason="job already CANCELLED"),
    RerunCase("no such job -> clear", None, mark_attempt=1, rule=Rule.CLEAR, reason="no such job"),
    RerunCase("rerun waits for capacity (attempt recorded) -> clear", record(state=State.WAITING_CAPACITY, attempt=2),
              mark_attempt=2, rule=Rule.CLEAR),
]


@pytest.mark.parametrize("case", RERUNS, ids=[c.name for c in RERUNS])
def test_rerun(case: RerunCase) -> None:
    iid = f"i-j-{case.mark_attempt}-0" if case.iid is None else case.iid or None
    snap = snapshot(records=[case.rec] if case.rec else [], instances=tuple(inst(iid=i) for i in case.listed),
                    preempted=[PreemptedMark("j", ago(5), case.mark_attempt, iid)])
    (action,) = rerun.decide(snap, NOW, POLICY)
    assert (action.rule, action.to, bool(action.get(Relaunch)), bool(action.get(ClearPreempted))) == (
        case.rule, case.to, case.relaunch, True)
    assert not case.reason or action.reason == case.reason
    if case.rec is not None and (action.to is not None or action.get(Relaunch)):
        assert action.expect == {case.rec.state} and action.expect_attempt == case.rec.attempt
    if case.rule == Rule.IGNORED:
        note = action.get(Note)
        assert note is not None and isinstance(note.event, IgnoredFact), action
        assert (note.event.attempt, note.event.key) == (case.rec.attempt, "preempted-jobs/j")
        assert action.reason == Rule.IGNORED.reason(fact="preempted marker", why=note.event.why)


def test_rerun_ignores_a_marker_that_does_not_parse_for_a_running_job() -> None:
    mark = PreemptedMark("j", ago(5), problem="preempted marker: field 'attempt': Field required")
    (action,) = rerun.decide(snapshot(records=[record(spot=True)], preempted=[mark]), NOW, POLICY)
    assert (action.rule, action.to, action.get(Relaunch), action.get(ClearPreempted)) == (
        Rule.IGNORED, None, None, ClearPreempted())
    assert action.get(Note) == Note(IgnoredFact(attempt=1, key="preempted-jobs/j", why=mark.problem))


def test_rerun_notes_a_marker_that_does_not_parse_on_a_preempted_job_and_reruns_it() -> None:
    mark = PreemptedMark("j", ago(5), problem="preempted marker: not valid JSON")
    (action,) = rerun.decide(snapshot(records=[record(state=State.PREEMPTED, spot=True)], preempted=[mark]), NOW,
                             POLICY)
    assert (action.rule, action.get(Relaunch), action.get(ClearPreempted)) == (Rule.RERUN, Relaunch(), ClearPreempted())
    assert action.get(Note) == Note(IgnoredFact(attempt=1, key="preempted-jobs/j",
                                                why="preempted marker: not valid JSON"))


def test_rerun_relaunches_from_preempted_whatever_state_it_saw() -> None:
    mark = PreemptedMark("j", ago(5), 1, "i-j-1-0")
    (action,) = rerun.decide(snapshot(records=[record(spot=True)], preempted=[mark]), NOW, POLICY)
    assert action.relaunch_expect == {State.PREEMPTED}
    (action,) = rerun.decide(snapshot(records=[record(state=State.PREEMPTED)], preempted=[PreemptedMark("j", NOW)]),
                             NOW, POLICY)
    assert action.relaunch_expect == {State.PREEMPTED}


# ---- uptime cap ----------------------------------------------------------------------------------------------
H = 3600


@dataclass
class CapCase:
    name: str
    snap: Snapshot
    rules: list[Rule]
    reason: str = ""
    pol: Policy = field(default_factory=lambda: POLICY)


def _running(age: float, cap: int = 8 * H, **kw: object) -> Snapshot:
    parts = healthy(cap=cap)
    parts["instances"] = (inst(age=age),)
    return Snapshot(**{**parts, **kw})  # type: ignore[arg-type]


CAPS = [
    CapCase("well under the cap", _running(7 * H), rules=[]),
    CapCase("within the grace (10 min) of the cap -> stop request", _running(8 * H - 599), rules=[Rule.STOP],
            reason="uptime cap 8h in 599s: stop requested"),
    CapCase("at the cap -> terminate + TIMED_OUT with the cap", _running(8 * H), rules=[Rule.TIMED_OUT],
            reason="uptime cap 8h reached"),
    CapCase("grace is at most cap/10: 1h cap stops at 54 min", _running(54 * 60, cap=H), rules=[Rule.STOP]),
    CapCase("... and not before", _running(54 * 60 - 1, cap=H), rules=[]),
    CapCase("a lowered policy ceiling wins over the job's recorded cap", _running(3 * H), rules=[Rule.TIMED_OUT],
            reason="uptime cap 2h reached", pol=Policy(max_runtime_ceiling=2 * H)),
    CapCase("no limits in the marker: the fetched record's max_runtime",
            snapshot(unmarked(healthy()), instances=(inst(age=2 * H),),
                     records=[record(state=State.LAUNCHING, max_runtime=2 * H)]), rules=[Rule.TIMED_OUT]),
    CapCase("a marker written before, with its old limits/ key listed: that key's cap",
            snapshot(unmarked(healthy()), limits=(limits(cap=2 * H),), instances=(inst(age=2 * H),)),
            rules=[Rule.TIMED_OUT]),
    CapCase("no limits in the marker and no record: the ceiling (never cut short)",
            Snapshot(**{**unmarked(healthy()), "instances": (inst(age=6 * 86400),)}), rules=[]),
    CapCase("managed instance with no job: the policy ceiling", Snapshot(instances=(inst("ghost", age=7 * 86400),)),
            rules=[Rule.CAP_NO_JOB], reason="i-ghost-1-0 has no live job and ran past the policy ceiling 7d"),
    CapCase("... below the ceiling: the sweeper's orphan rule handles it",
            Snapshot(instances=(inst("ghost", age=6 * 86400),)), rules=[]),
    CapCase("instance of a past attempt: the ceiling",
            Snapshot(active={"j": (marker(attempt=2),)}, instances=(inst(attempt=1, age=7 * 86400),)),
            rules=[Rule.CAP_NO_JOB]),
    CapCase("unmanaged or protected instances are never capped",
            Snapshot(instances=(inst("x", managed=False, age=10**7), inst("y", protected=True, age=10**7))), rules=[]),
]


@pytest.mark.parametrize("case", CAPS, ids=[c.name for c in CAPS])
def test_uptime_cap(case: CapCase) -> None:
    actions = uptime.decide(case.snap, NOW, case.pol)
    assert [a.rule for a in actions] == case.rules
    if actions:
        assert not case.reason or actions[0].reason == case.reason


def test_timed_out_terminates_every_rank_and_claims_the_attempt() -> None:
    parts = healthy(nodes=2, cap=8 * H)
    parts["instances"] = (inst(rank=0, age=8 * H), inst(rank=1, age=8 * H - 5))
    (action,) = uptime.decide(Snapshot(**parts), NOW, POLICY)
    assert action == Action(Rule.TIMED_OUT, "j", "uptime cap 8h reached",
                            (Transition(State.TIMED_OUT), Terminate(("i-j-1-0", "i-j-1-1"))), expect=LIVE,
                            expect_attempt=1)


def test_stop_request_is_a_stop_and_nothing_else() -> None:
    (action,) = uptime.decide(_running(8 * H - 60), NOW, POLICY)
    assert action.effects == (RequestStop(),)


def test_uptime_respects_the_blast_radius() -> None:
    snap = Snapshot(instances=tuple(inst(f"g{i}", age=7 * 86400) for i in range(3)))
    actions = uptime.decide(snap, NOW, policy(max_terminations_per_run=1))
    assert [a.refused is None for a in actions] == [True, False, False]


def test_needs_record_only_for_live_jobs_without_limits() -> None:
    parts = healthy()
    snap = Snapshot(active={**parts["active"], "k": (marker("k", State.LAUNCHING),)},
                    instances=(inst(), inst("k"), inst("ghost")))
    assert uptime.needs_record(snap) == {"k"}
