"""Idle GPUs, decided on snapshots (no I/O): the agents' `.idle` marks in the heartbeats listing make a RUNNING
job a candidate (and only then is its job.json read); warn flags it once (event, metric, notice); stop also
asks it to stop, and the stopped job ends STALLED saying why."""

from __future__ import annotations

from typing import Any

import pytest

from jobplane.decide import check
from jobplane.decide.effects import DeleteKeys, Flag, Note, Publish, RequestStop
from jobplane.decide.model import Rule, Snapshot
from jobplane.model import keys
from jobplane.model.history import IdleGpu
from jobplane.model.listings import IdleMark
from jobplane.model.policy import IdleGpuPolicy, Policy
from jobplane.model.states import State
from tests.decide.helpers import NOW as T
from tests.decide.helpers import Candidate, ago, beats, healthy, inst, limits, marker, record, report, snapshot

WARN = Policy(idle_gpu=IdleGpuPolicy(window=1800, threshold=5, action="warn"))
STOP = Policy(idle_gpu=IdleGpuPolicy(window=1800, threshold=5, action="stop"))
OFF = Policy(idle_gpu=IdleGpuPolicy(action="off"))


def idle(ranks: int = 1, at: float = 10, attempt: int = 1) -> tuple[IdleMark, ...]:
    """Rank marks written with the heartbeats (beats() puts every heartbeat 10 s ago)."""
    return tuple(IdleMark("j", attempt, r, ago(at)) for r in range(ranks))


def listed(nodes: int = 1, **over: Any) -> Snapshot:
    return Snapshot(**{**healthy(nodes=nodes), **over})


CANDIDATES: list[Candidate] = [
    Candidate("every rank idle", listed(idle=idle()), read=True, policy=WARN),
    Candidate("every rank of two idle", listed(2, idle=idle(2)), read=True, policy=WARN),
    Candidate("one rank of two idle", listed(2, idle=idle(1)), read=False, policy=WARN),
    Candidate("idle mark older than the rank's newest heartbeat: busy again", listed(idle=idle(at=45)), read=False,
              policy=WARN),
    Candidate("idle mark a second older than the heartbeat (same write, 1 s resolution)", listed(idle=idle(at=11)),
              read=True, policy=WARN),
    Candidate("idle mark of the past attempt", listed(idle=idle(attempt=0)), read=False, policy=WARN),
    Candidate("flagged already", listed(idle=idle(), idle_flags=frozenset({("j", 1)})), read=False, policy=WARN),
    Candidate("policy off", listed(idle=idle()), read=False, policy=OFF),
    Candidate("no marks: a healthy job is never read", listed(), read=False, policy=WARN),
]


@pytest.mark.parametrize("row", CANDIDATES, ids=[c.name for c in CANDIDATES])
def test_idle_jobs_are_candidates_from_listings_alone(row: Candidate) -> None:
    assert (check.candidates(row.snap, T, row.policy) == {"j"}) is row.read


def decide(policy: Policy, nodes: int = 1, **over: Any) -> list[Any]:
    owned = record(nodes=nodes, labels={"team": "cv"}).model_copy(update={"owner": "vision"})
    snap = snapshot(healthy(nodes=nodes), records=[owned], idle=idle(nodes), **over)
    return check.decide(snap, T, policy)


def test_warn_flags_the_attempt_once_with_an_event_a_notice_and_no_stop() -> None:
    (action,) = decide(WARN, nodes=2)
    assert action.rule == Rule.IDLE and action.to is None and not action.get(RequestStop) and not action.terminate
    assert action.get(Flag) == Flag(keys.idle_flag("j", 1)) and action.expect_attempt == 1
    assert action.reason == "GPU utilization under 5% on every rank for 30m"
    assert action.get(Note) == Note(IdleGpu(attempt=1, reason=action.reason, action="warn", threshold=5, window=1800))
    published = action.get(Publish)
    assert published is not None
    notice = published.notice
    assert notice.subject == "jobplane: j has idle GPUs" and notice.data["event"] == "idle-gpu"
    assert notice.data["owner"] == "vision" and notice.data["logs"] == "jobplane logs j"
    assert "it keeps running" in notice.text and "jobplane logs j" in notice.text


def test_stop_also_asks_the_agents_to_stop_as_idle_gpu() -> None:
    (action,) = decide(STOP)
    assert action.rule == Rule.IDLE and action.get(RequestStop) == RequestStop(by="idle-gpu") and not action.terminate
    published = action.get(Publish)
    assert action.reason.endswith("; stop requested") and published and "it is being stopped" in published.notice.text


def test_flagged_attempts_and_the_off_policy_are_left_alone() -> None:
    assert decide(WARN, idle_flags=frozenset({("j", 1)})) == []
    assert decide(OFF) == []


def test_a_job_stopped_for_idle_gpus_ends_stalled_saying_why_and_its_vms_go() -> None:
    stopped = report(0, 143, "stopped", stopped_by="idle-gpu",
                         stop_reason="GPU utilization under 5% on every rank for 30m; stop requested")
    snap = snapshot(healthy(), records=[record()], exits={"j": [stopped]})
    (action,) = check.decide(snap, T, STOP)
    assert action.rule == Rule.IDLE_STOPPED and action.to == State.STALLED
    assert action.reason == "stopped for idle GPUs: GPU utilization under 5% on every rank for 30m; stop requested"
    assert action.terminate == ("i-j-1-0",)
    cap = check.decide(snapshot(healthy(), records=[record()], exits={"j": [report(0, 143, "stopped",
                                                                                       stopped_by="uptime-cap")]}),
                       T, STOP)
    assert cap[0].rule == Rule.STOPPED and cap[0].to == State.TIMED_OUT  # the uptime cap's stop is unchanged


def test_cleanup_drops_idle_marks_and_flags_of_past_attempts() -> None:
    snap = Snapshot(active={"j": (marker(attempt=2),)}, beats=tuple(beats(attempt=2)), limits=(limits(attempt=2),),
                    instances=(inst(attempt=2),), idle=(IdleMark("j", 1, 0, ago(3600)),),
                    idle_flags=frozenset({("j", 1), ("j", 2)}))
    (cleanup,) = check.decide(snap, T, WARN)
    assert cleanup.rule == Rule.CLEANUP
    (deleted,) = cleanup.effects
    assert isinstance(deleted, DeleteKeys) and set(deleted.keys) == {keys.idle_mark("j", 1, 0), keys.idle_flag("j", 1)}
