"""The check's pure decisions, one table row per rule (no I/O anywhere in this file)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from jobplane.decide import check, job_cost
from jobplane.decide.effects import (
    DeleteKeys,
    Flag,
    MarkPreempted,
    Relaunch,
    RequestStop,
    SaveConsole,
    Transition,
    WriteLimits,
)
from jobplane.decide.model import Action, Ignored, PreemptedMark, Rule, Snapshot
from jobplane.model import keys
from jobplane.model.listings import Beat
from jobplane.model.policy import Policy
from jobplane.model.states import State, StopBy
from tests.decide.helpers import (
    NOW,
    POLICY,
    Candidate,
    ago,
    beats,
    healthy,
    inst,
    limits,
    marker,
    policy,
    record,
    report,
    snapshot,
    unmarked,
)


# ---- candidates: which jobs need job.json, from listings alone -------------------------------------------
def _with(parts: dict[str, Any], **over: Any) -> Snapshot:
    return Snapshot(**{**parts, **over})


_COST = (("costleft", 50), ("centsph", 200))
CANDIDATES: list[Candidate] = [
    Candidate("healthy running job", _with(healthy()), read=False),
    Candidate("healthy 2-node job", _with(healthy(nodes=2)), read=False),
    Candidate("a RUNNING marker written before it carried the limits", _with(unmarked(healthy())), read=True),
    Candidate("... with its old limits/ key listed: read, to move them into the marker",
              _with(unmarked(healthy()), limits=(limits(),)), read=True),
    Candidate("heartbeat older than the job's own stall timeout (shorter than the policy's)",
              _with(healthy(stall=60), beats=tuple(beats(hb=90))), read=True),
    Candidate("heartbeat fresh within a long stall timeout", _with(healthy(), beats=tuple(beats(hb=90))), read=False),
    Candidate("no new output for the stall timeout", _with(healthy(), beats=tuple(beats(out=1801))), read=True),
    Candidate("never printed since RUNNING began long ago",
              _with(healthy(), beats=tuple(beats(out=None)), active={"j": (marker(since=1801),)}), read=True),
    Candidate("never printed, RUNNING for a minute", _with(healthy(), beats=tuple(beats(out=None))), read=False),
    Candidate("rank 1 never beat", _with(healthy(nodes=2), beats=tuple(beats(ranks=1))), read=True),
    Candidate("instance vanished", _with(healthy(), instances=()), read=True),
    Candidate("one of two instances vanished", _with(healthy(nodes=2), instances=(inst(rank=0),)), read=True),
    Candidate("instance stopping", _with(healthy(), instances=(inst(state="stopping"),)), read=True),
    Candidate("LAUNCHING", _with(healthy(), active={"j": (marker(state=State.LAUNCHING),)}), read=True),
    Candidate("two markers", _with(healthy(), active={"j": (marker(), marker(state=State.LAUNCHING, attempt=2))}),
              read=True),
    Candidate("QUEUED is the launcher's", _with(healthy(), active={"j": (marker(state=State.QUEUED, attempt=0,
                                                                               since=60),)}), read=False),
    Candidate("PREEMPTED is rerun's", _with(healthy(), active={"j": (marker(state=State.PREEMPTED, since=60),)}),
              read=False),
    # ... unless it has stayed so past LAUNCH_GRACE: a launcher or rerun may have died before moving it
    Candidate("QUEUED for long", _with(healthy(), active={"j": (marker(state=State.QUEUED, attempt=0,
                                                                       since=601),)}), read=True),
    Candidate("PREEMPTED for long", _with(healthy(), active={"j": (marker(state=State.PREEMPTED, since=601),)}),
              read=True),
    Candidate("named by an event", _with(healthy(), forced=frozenset({"j"})), read=True),
    # max_cost: its marker carries the cents left and cents an hour; its VMs' launch is the cloud's listing's
    Candidate("max_cost: 15 min at $2/h of 50 cents left",
              _with(healthy(), active={"j": (marker(limits=replace(limits(), facts=_COST)),)}), read=True),
    Candidate("max_cost: 15 min at $2/h of $5 left",
              _with(healthy(), active={"j": (marker(limits=replace(limits(), facts=(("costleft", 500),
                                                                                  ("centsph", 200)))),)}), read=False),
]


@pytest.mark.parametrize("row", CANDIDATES, ids=[c.name for c in CANDIDATES])
def test_candidates(row: Candidate) -> None:
    assert (check.candidates(row.snap, NOW, row.policy) == {"j"}) is row.read


def test_event_for_a_job_that_is_not_live_fetches_nothing() -> None:
    assert check.candidates(Snapshot(forced=frozenset({"gone"})), NOW, POLICY) == set()


# ---- decide: one row per rule ------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    snap: Snapshot
    rules: list[Rule]  # expected actions' rules, in order
    to: State | None = None  # first action's transition
    terminate: tuple[str, ...] = ()  # first action's terminations
    reason: str = ""  # the first action's reason, if given
    pol: Policy = field(default_factory=lambda: POLICY)


def _job(rec_kw: dict[str, Any] | None = None, parts: dict[str, Any] | None = None, **snap_kw: Any) -> Snapshot:
    rec_kw = rec_kw or {}
    rec = record(**rec_kw)
    base = healthy(nodes=rec.spec.num_nodes, attempt=rec.attempt)
    own = limits(nodes=rec.spec.num_nodes, attempt=rec.attempt) if rec.state == State.RUNNING else None
    base["active"] = {"j": (marker(state=rec.state, attempt=rec.attempt, limits=own),)}
    return snapshot({**base, **(parts or {})}, records=[rec], **snap_kw)


DATA = keys.JobData("j", keys.DEFAULT_OWNER)  # where job j keeps its data (tests.decide.helpers.record)
TWO_SPOT = {"nodes": 2, "spot": True}
NAN = 'train:loss became nan at step 1200: "step 1200 train:loss nan"'
CASES = [
    Case("healthy job fetched by an event: nothing to do", _job(), rules=[]),
    Case("finished: every rank exited 0 -> SUCCEEDED, leftover instance terminated", _job(exits={"j": [report(0, 0)]}),
         rules=[Rule.FINISHED], to=State.SUCCEEDED, terminate=("i-j-1-0",), reason="every rank exited 0"),
    Case("finished: a powered-off (stopped) VM is deleted too, its disk still bills",
         _job(parts={"instances": (inst(state="stopped"),)}, exits={"j": [report(0, 0)]}), rules=[Rule.FINISHED],
         to=State.SUCCEEDED, terminate=("i-j-1-0",)),
    Case("finished: first non-zero code by rank -> FAILED",
         _job({"nodes": 2}, {"instances": ()}, exits={"j": [report(0, 0), report(1, 3)]}), rules=[Rule.FINISHED],
         to=State.FAILED, terminate=(), reason="rank 1 exited with code 3"),
    Case("finished: the agent's error (a failed requirements.txt) is in the reason",
         _job(exits={"j": [report(0, 1, "exit", "requirements.txt: could not install it")]}), rules=[Rule.FINISHED],
         to=State.FAILED, terminate=("i-j-1-0",),
         reason="rank 0 exited with code 1: requirements.txt: could not install it"),
    Case("one of two ranks exited 0, the other still healthy: wait", _job({"nodes": 2}, exits={"j": [report(1, 0)]}),
         rules=[]),
    Case("every rank stopped on request -> TIMED_OUT with the cap",
         _job({"max_runtime": 7200}, exits={"j": [report(0, 143, "stopped")]}), rules=[Rule.STOPPED],
         to=State.TIMED_OUT, terminate=("i-j-1-0",), reason="stopped at the uptime cap (2h)"),
    Case("stopped on a stop_on match -> FAILED quoting it, never rerun (no relaunch, no preempted marker)",
         _job({"spot": True}, exits={"j": [report(0, 0, "early-stop", NAN)]}), rules=[Rule.EARLY_STOP],
         to=State.FAILED, terminate=("i-j-1-0",), reason=f"stopped: {NAN}"),
    Case("a stop_on match wins over the peers that stopped on request or crashed; the reason names its rank",
         _job({"nodes": 3}, {"instances": ()}, exits={"j": [report(0, 143, "stopped"), report(1, 1),
                                                             report(2, 0, "early-stop", NAN)]}),
         rules=[Rule.EARLY_STOP], to=State.FAILED, terminate=(), reason=f"stopped: {NAN} (rank 2)"),
    Case("a rank stopped on a stop_on match, its peer still runs -> ask it to stop, no transition yet",
         _job({"nodes": 2}, exits={"j": [report(0, 0, "early-stop", NAN)]}), rules=[Rule.STOP_PEERS], to=None,
         terminate=(), reason=f"rank 0 stopped ({NAN}): asking rank 1 to stop"),
    Case("a rank of a multi-node attempt exits non-zero -> FAILED at once, the other ranks terminated",
         _job({"nodes": 3}, exits={"j": [report(0, 0), report(2, 1, error="CUDA out of memory")]}),
         rules=[Rule.RANK_FAILED], to=State.FAILED, terminate=("i-j-1-0", "i-j-1-1", "i-j-1-2"),
         reason="rank 2 exited with code 1: CUDA out of memory; ending the attempt (terminating rank 1)"),
    Case("... while the job is still LAUNCHING (another rank has not beaten yet)",
         _job({"nodes": 2, "state": State.LAUNCHING}, {"beats": tuple(beats(ranks=1))}, exits={"j": [report(0, 125)]}),
         rules=[Rule.RANK_FAILED], to=State.FAILED, terminate=("i-j-1-0", "i-j-1-1"),
         reason="rank 0 exited with code 125; ending the attempt (terminating rank 1)"),
    Case("a rank stopped (uptime cap, code 143) while another still runs: wait for it",
         _job({"nodes": 2}, exits={"j": [report(0, 143, "stopped")]}), rules=[]),
    Case("a rank preempted while another failed: rerun's, not a failure",
         _job({"nodes": 2, "spot": True}, exits={"j": [report(0, 143, "preempted"), report(1, 1)]}), rules=[]),
    Case("an exit report written by another job's VM is ignored (an event, once) and changes nothing",
         _job(exits={"j": [report(0, 0, instance_id="i-other-1-0")]}), rules=[Rule.IGNORED], to=None, terminate=(),
         reason="ignored jobs/j/attempts/1/nodes/0/exit.json: written by i-other-1-0, not an instance of attempt 1"),
    Case("... a rank's report naming an instance of the previous attempt too",
         _job({"attempt": 2}, exits={"j": [report(0, 1, attempt=1)]}), rules=[Rule.IGNORED], to=None, terminate=(),
         reason="ignored jobs/j/attempts/2/nodes/0/exit.json: written by i-j-1-0, not an instance of attempt 2"),
    Case("... already recorded by an earlier run: nothing",
         _job(exits={"j": [report(0, 0, instance_id="i-other-1-0")]},
              noted=frozenset({"jobs/j/attempts/1/ignored/nodes.0.exit.json"})), rules=[]),
    Case("an exit report that does not parse is ignored with an event; the others still count",
         _job({"nodes": 2}, exits={"j": [report(0, 0)]},
              unreadable={"j": (Ignored(keys.exit_report("j", 1, 1), "exit report: field 'code': Field required"),)}),
         rules=[Rule.IGNORED], to=None, terminate=(),
         reason="ignored jobs/j/attempts/1/nodes/1/exit.json: exit report: field 'code': Field required"),
    Case("the VM is gone from the cloud's listing but job.json names it: its report counts",
         _job({"nodes": 2}, {"instances": (inst(rank=1),)}, exits={"j": [report(0, 0), report(1, 0)]}),
         rules=[Rule.FINISHED], to=State.SUCCEEDED, terminate=("i-j-1-1",)),
    Case("the VM is in the listing, not yet in job.json: its report counts",
         _job({"instances": []}, exits={"j": [report(0, 0)]}), rules=[Rule.FINISHED], to=State.SUCCEEDED,
         terminate=("i-j-1-0",)),
    Case("a preempted marker from another job's VM does not hold the check back",
         _job(exits={"j": [report(0, 0)]}, preempted=[PreemptedMark("j", ago(5), 1, "i-other-1-0")]),
         rules=[Rule.FINISHED], to=State.SUCCEEDED, terminate=("i-j-1-0",)),
    Case("exit with reason preempted is rerun's", _job({"spot": True}, exits={"j": [report(0, 143, "preempted")]}),
         rules=[]),
    Case("LAUNCHING and every rank beat -> RUNNING and limits written",
         _job({"state": State.LAUNCHING, "nodes": 2, "stall_timeout": 300}), rules=[Rule.STARTED], to=State.RUNNING),
    Case("LAUNCHING, one rank beat, within boot timeout: wait",
         _job({"state": State.LAUNCHING, "nodes": 2, "launched": 300}, {"beats": tuple(beats(ranks=1))}), rules=[]),
    Case("boot timeout with restarts left -> terminate and relaunch",
         _job({"state": State.LAUNCHING, "launched": 901}, {"beats": ()}), rules=[Rule.BOOT_RETRY], to=None,
         terminate=("i-j-1-0",),
         reason="the agent never started: no heartbeat from rank 0 within boot_timeout 15m (the VM's console output "
                "is in `jobplane logs j --attempt 1`); retrying as attempt 2"),
    Case("boot timeout, restarts used up -> FAILED",
         _job({"state": State.LAUNCHING, "launched": 901, "restarts": 3}, {"beats": ()}), rules=[Rule.BOOT_FAILED],
         to=State.FAILED, terminate=("i-j-1-0",),
         reason="the agent never started: no heartbeat from rank 0 within boot_timeout 15m (the VM's console output "
                "is in `jobplane logs j --attempt 1`); no restarts left (max_restarts 3)"),
    Case("boot timeout, restarts left but the policy's attempts used up -> FAILED",
         _job({"state": State.LAUNCHING, "launched": 901, "attempt": 3, "restarts": 2}, {"beats": ()}),
         rules=[Rule.BOOT_FAILED], to=State.FAILED, terminate=("i-j-3-0",), pol=Policy(max_attempts_per_job=3),
         reason="the agent never started: no heartbeat from rank 0 within boot_timeout 15m (the VM's console output "
                "is in `jobplane logs j --attempt 3`); attempt 3 was the last the policy allows "
                "(max_attempts_per_job 3)"),
    Case("boot timeout past max_wait -> FAILED: no attempt starts after it",
         _job({"state": State.LAUNCHING, "launched": 901, "created": 7201, "max_wait": 7200}, {"beats": ()}),
         rules=[Rule.BOOT_FAILED], to=State.FAILED, terminate=("i-j-1-0",),
         reason="the agent never started: no heartbeat from rank 0 within boot_timeout 15m (the VM's console output "
                "is in `jobplane logs j --attempt 1`); max_wait 2h exceeded"),
    Case("boot timeout counts from the launch, per job",
         _job({"state": State.LAUNCHING, "launched": 200, "boot_timeout": 120}, {"beats": ()}),
         rules=[Rule.BOOT_RETRY], to=None, terminate=("i-j-1-0",),
         reason="the agent never started: no heartbeat from rank 0 within boot_timeout 2m (the VM's console output "
                "is in `jobplane logs j --attempt 1`); retrying as attempt 2"),
    Case("a VM's bootstrap reported why the agent cannot start -> FAILED at once, no retry",
         _job({"state": State.LAUNCHING, "launched": 60}, {"beats": ()}, boot_failures={"j": "python3 is 3.9"}),
         rules=[Rule.BOOT_FAILED], to=State.FAILED, terminate=("i-j-1-0",),
         reason="the agent could not start: python3 is 3.9 "
                "(the VM's console output is in `jobplane logs j --attempt 1`)"),
    Case("a boot failure reported for a job that is RUNNING (every rank beat) changes nothing",
         _job(boot_failures={"j": "late"}), rules=[]),
    Case("LAUNCHING before any instance is recorded is never lost or timed out early",
         _job({"state": State.LAUNCHING, "launched": None, "since": 30, "instances": []},
              {"beats": (), "instances": ()}), rules=[]),
    Case("stalled: no heartbeat for stall_timeout -> STALLED, instances terminated",
         _job(parts={"beats": tuple(beats(hb=1801))}), rules=[Rule.STALLED], to=State.STALLED, terminate=("i-j-1-0",),
         reason="no heartbeat from rank 0 for 1801s (stall_timeout 30m)"),
    Case("stalled: heartbeats but no new output for the job's stall_timeout",
         _job({"stall_timeout": 600}, {"beats": tuple(beats(out=700))}), rules=[Rule.STALLED], to=State.STALLED,
         terminate=("i-j-1-0",), reason="no new output for 700s (stall_timeout 10m)"),
    Case("a rank that exited stops beating without being stalled",
         _job({"nodes": 2}, {"beats": (Beat("j", 1, 0, False, ago(5)), Beat("j", 1, 1, False, ago(4000)),
                                       Beat("j", 1, 0, True, ago(5)))}, exits={"j": [report(1, 0)]}), rules=[]),
    Case("lost Spot rank of a 2-node job -> PREEMPTED + marker, survivor torn down",
         _job(TWO_SPOT, {"instances": (inst(rank=0),)}), rules=[Rule.LOST_SPOT], to=State.PREEMPTED,
         terminate=("i-j-1-0",), reason="Spot capacity lost: rank 1 (i-j-1-1) gone"),
    Case("lost on-demand instance -> FAILED (lost)", _job(parts={"instances": ()}), rules=[Rule.LOST], to=State.FAILED,
         terminate=(), reason="lost: rank 0 (i-j-1-0) vanished"),
    Case("an instance in shutting-down/terminated counts as lost",
         _job(parts={"instances": (inst(state="terminated"),)}), rules=[Rule.LOST], to=State.FAILED, terminate=()),
    Case("LAUNCHING Spot attempt reclaimed before its first heartbeat -> PREEMPTED",
         _job({"state": State.LAUNCHING, "spot": True, "launched": 300}, {"beats": (), "instances": ()}),
         rules=[Rule.LOST_SPOT], to=State.PREEMPTED),
    Case("just launched and not listed yet: not lost", _job({"launched": 30}, {"instances": ()}), rules=[]),
    Case("a seconds-long orphan grace (local cloud) shortens the lost grace",
         _job({"launched": 30}, {"instances": ()}), rules=[Rule.LOST], to=State.FAILED, pol=policy(orphan_grace=10)),
    Case("the agent already reported the preemption: rerun's job",
         _job({"spot": True}, {"instances": ()}, preempted=[PreemptedMark("j", ago(5), 1, "i-j-1-0")]), rules=[]),
    Case("RUNNING, its marker written before markers carried limits -> record them", _job(parts=unmarked(healthy())),
         rules=[Rule.LIMITS]),
    Case("markers disagree with job.json -> repair",
         _job(parts={"active": {"j": (marker(limits=limits()), marker(state=State.LAUNCHING, attempt=2))}}),
         rules=[Rule.REPAIR]),
    Case("terminal job with a stale marker -> repair; its instance is an orphan after the grace",
         _job({"state": State.SUCCEEDED}, {"instances": (inst(age=601),)}),
         rules=[Rule.REPAIR, Rule.ORPHAN], to=None, terminate=(),
         reason="active/ markers disagree with job.json"),
]


def _check(case: Case) -> list[Action]:
    actions = check.decide(case.snap, NOW, case.pol)
    assert [a.rule for a in actions] == case.rules, actions
    if actions:
        first = actions[0]
        assert first.to == case.to
        assert first.terminate == case.terminate
        assert not case.reason or first.reason == case.reason
        assert first.refused is None
    return actions


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide_job_rules(case: Case) -> None:
    _check(case)


def test_an_early_stop_records_the_exit_code_and_asks_peers_to_stop_until_they_report() -> None:
    (failed,) = check.decide(_job(exits={"j": [report(0, 143, "early-stop", NAN)]}), NOW, POLICY)
    assert failed.get(Transition) == Transition(State.FAILED, {"exit_code": 143})
    assert failed.get(Relaunch) is None and failed.get(MarkPreempted) is None
    (ask,) = check.decide(_job({"nodes": 2}, exits={"j": [report(1, 0, "early-stop", NAN)]}), NOW, POLICY)
    assert ask.effects == (RequestStop(by="sweeper"),)


def test_transitions_carry_what_the_run_saw() -> None:
    (action,) = check.decide(_job({"nodes": 2}, {"instances": ()}, exits={"j": [report(0, 0), report(1, 3)]}),
                             NOW, POLICY)
    assert action.expect == {State.RUNNING} and action.expect_attempt == 1
    assert action.get(Transition) == Transition(State.FAILED, {"exit_code": 3})


def test_vms_whose_agent_never_started_have_their_console_saved() -> None:
    """Only the ranks without a heartbeat: their console output says why."""
    launching = {"state": State.LAUNCHING, "launched": 901, "nodes": 3}
    (timeout,) = check.decide(_job(launching, {"beats": tuple(beats(ranks=1))}), NOW, POLICY)
    assert timeout.rule == Rule.BOOT_RETRY
    assert timeout.get(SaveConsole) == SaveConsole(((1, "i-j-1-1"), (2, "i-j-1-2")), DATA)
    failed = _job({**launching, "launched": 60}, {"beats": ()}, boot_failures={"j": "no python3"})
    (boot,) = check.decide(failed, NOW, POLICY)
    assert boot.get(SaveConsole) == SaveConsole(((0, "i-j-1-0"), (1, "i-j-1-1"), (2, "i-j-1-2")), DATA)


def test_started_records_the_jobs_own_limits_which_its_running_marker_carries() -> None:
    (action,) = check.decide(_job({"state": State.LAUNCHING, "nodes": 2, "stall_timeout": 300, "max_runtime": 3600}),
                             NOW, POLICY)
    assert action.get(Transition) == Transition(State.RUNNING, {"limits": "nodes-2.stall-300.cap-3600"})
    assert keys.active_marker("j", State.RUNNING, 1, "nodes-2.stall-300.cap-3600") == \
        "active/j/RUNNING.1.nodes-2.stall-300.cap-3600"


def test_a_marker_written_before_gets_the_old_limits_key_and_idle_flag_moved_into_active() -> None:
    """A job started before the limits rode in its marker: the check records the limits its old limits/ key holds
    (renaming the marker), creates the idle flag beside the markers (claiming the move) and deletes the old keys."""
    old = limits(stall=77)
    snap = _job(parts={**unmarked(healthy()), "limits": (old,)}, old_idle_flags=frozenset({("j", 1)}))
    (action,) = check.decide(snap, NOW, POLICY)
    assert action.rule == Rule.LIMITS and action.expect_attempt == 1
    assert action.get(WriteLimits) == WriteLimits(old)
    assert action.get(Flag) == Flag("active/j.1.idle-flagged")
    assert action.get(DeleteKeys) == DeleteKeys(("limits/j/1/nodes-1.stall-77.cap-86400", "limits/j/1/idle-flagged"))


def test_lost_spot_marker_names_the_attempt_and_instance() -> None:
    (action,) = check.decide(_job(TWO_SPOT, {"instances": (inst(rank=0),)}), NOW, POLICY)
    mark = action.get(MarkPreempted)
    assert mark is not None and mark.marker.attempt == 1 and mark.marker.instance_id == "i-j-1-1"


# ---- orphans, markers, housekeeping: from listings, no record needed ------------------------------------
ORPHANS = [
    Case("managed instance of an unknown/terminal job, past the grace -> terminate",
         Snapshot(instances=(inst("ghost", age=601),)), rules=[Rule.ORPHAN], to=None, terminate=("i-ghost-1-0",),
         reason="orphan i-ghost-1-0: job ghost is not live"),
    Case("... within the grace (a launch in flight) -> untouched", Snapshot(instances=(inst("ghost", age=599),)),
         rules=[]),
    Case("instance of a past attempt -> terminate",
         Snapshot(active={"j": (marker(attempt=2),)}, instances=(inst(attempt=1, age=601),)), rules=[Rule.ORPHAN],
         to=None, terminate=("i-j-1-0",), reason="orphan i-j-1-0: attempt 1 is not job j's current attempt 2"),
    Case("managed instance without a job id -> terminate", Snapshot(instances=(inst(None, None, iid="i-x", age=601),)),
         rules=[Rule.ORPHAN], to=None, terminate=("i-x",)),
    Case("unmanaged instance -> never touched", Snapshot(instances=(inst("ghost", managed=False, age=10**6),)),
         rules=[]),
    Case("termination-protected instance -> never touched",
         Snapshot(instances=(inst("ghost", protected=True, age=10**6),)), rules=[]),
    Case("instance of the current attempt of a live job -> not an orphan",
         Snapshot(active={"j": (marker(state=State.LAUNCHING),)}, instances=(inst(age=10**5),)), rules=[]),
    Case("PREEMPTED without its preempted-jobs/ marker -> write it again",
         Snapshot(active={"j": (marker(state=State.PREEMPTED, since=61),)}), rules=[Rule.REMARK]),
    Case("... the transition just happened -> wait for the writer",
         Snapshot(active={"j": (marker(state=State.PREEMPTED, since=5),)}), rules=[]),
    Case("PREEMPTED with its marker -> nothing",
         snapshot({"active": {"j": (marker(state=State.PREEMPTED, since=61),)}},
                  preempted=[PreemptedMark("j", ago(60))]), rules=[]),
]


@pytest.mark.parametrize("case", ORPHANS, ids=[c.name for c in ORPHANS])
def test_decide_listing_rules(case: Case) -> None:
    _check(case)


def test_cleanup_deletes_keys_of_ended_jobs_and_past_attempts() -> None:
    snap = Snapshot(
        active={"j": (marker(attempt=2),)},
        beats=(*beats("done", hb=700, out=800), *beats("j", 1, hb=700, out=900), *beats("j", 2),
               *beats("recent", hb=30)),
        limits=(limits("j", 1), limits("j", 2), limits("done"), limits("k")),  # old limits/ keys
        idle_flags=frozenset({("done", 1), ("j", 2)}), old_idle_flags=frozenset({("j", 1), ("k", 1)}),
        instances=(inst("j", 2),),
    )
    snap = replace(snap, active={**snap.active, "k": (marker("k", limits=limits("k")),)})  # k's moved into its marker
    actions = check.decide(snap, NOW, POLICY)
    assert {a.job_id: set(e.keys) for a in actions if a.rule == Rule.CLEANUP for e in a.effects
            if isinstance(e, DeleteKeys)} == {
        "done": {keys.heartbeat("done", 1, 0), keys.output_mark("done", 1, 0), limits("done").key,
                 "active/done.1.idle-flagged"},
        "j": {keys.heartbeat("j", 1, 0), keys.output_mark("j", 1, 0), limits("j", 1).key, "limits/j/1/idle-flagged"},
        "k": {limits("k").key},
    }


# ---- safety ------------------------------------------------------------------------------------------------
def _orphans(n: int) -> Snapshot:
    return Snapshot(instances=tuple(inst(f"ghost{i}", age=601) for i in range(n)))


def test_blast_radius_caps_terminations_per_run() -> None:
    actions = check.decide(_orphans(30), NOW, policy(max_terminations_percent=100))
    assert sum(1 for a in actions if a.refused is None) == 20
    assert sum(1 for a in check.decide(_orphans(30), NOW, POLICY) if a.refused is None) == 15  # 50% of 30
    refused = [a for a in actions if a.refused]
    assert len(refused) == 10 and "limit of 20" in (refused[0].refused or "")


def test_blast_radius_percent_of_managed_fleet() -> None:
    snap = _orphans(4)
    snap = Snapshot(instances=(*snap.instances, *(inst(f"live{i}") for i in range(6))),
                    active={f"live{i}": (marker(f"live{i}", state=State.LAUNCHING),) for i in range(6)})
    actions = check.decide(snap, NOW, policy(max_terminations_percent=20))
    assert [a.refused is None for a in actions] == [True, True, False, False]  # 20% of 10 managed


def test_blast_radius_lets_a_fleet_of_one_lose_its_orphan_and_force_overrides() -> None:
    assert [a.refused for a in check.decide(_orphans(1), NOW, POLICY)] == [None]
    assert all(a.refused is None for a in check.decide(_orphans(30), NOW, POLICY, force=True))
    assert all(a.refused for a in check.decide(_orphans(3), NOW, policy(max_terminations_per_run=0)))


def test_blast_radius_serves_finished_jobs_before_orphans() -> None:
    snap = _job(exits={"j": [report(0, 0)]})
    snap = Snapshot(**{**snap.__dict__, "instances": (*snap.instances, *_orphans(3).instances)})
    actions = check.decide(snap, NOW, policy(max_terminations_per_run=2))
    assert [(a.rule, a.refused is None) for a in actions] == [
        (Rule.FINISHED, True), (Rule.ORPHAN, True), (Rule.ORPHAN, False), (Rule.ORPHAN, False)]


def test_blast_radius_always_lets_one_multi_node_job_go() -> None:
    snap = _job({"nodes": 4}, exits={"j": [report(r, 0) for r in range(4)]})
    (action,) = check.decide(snap, NOW, POLICY)  # 4 > 50% of 4 managed, but the first action is bounded by N only
    assert action.refused is None and len(action.terminate) == 4
    (action,) = check.decide(snap, NOW, policy(max_terminations_per_run=3))
    assert action.refused


def test_max_cost_asks_for_a_stop_at_the_cap_then_ends_the_attempt_naming_it() -> None:
    from jobplane.model.usage import AttemptUsage, InstanceSpan

    def costing(hours: float, **more: Any) -> Snapshot:
        snap = _job({"max_cost": 5.0}, **more)
        used = AttemptUsage(attempt=1, instance_type="g5.xlarge", market="on-demand", price=2.0,
                            instances=[InstanceSpan(id="i-j-1-0", start=ago(hours * 3600))])
        return replace(snap, records={"j": snap.records["j"].model_copy(update={"usage": [used]})})

    assert check.decide(costing(2.4), NOW, POLICY) == [], "$4.80 of $5"
    (stop,) = check.decide(costing(2.5), NOW, POLICY)
    assert (stop.rule, stop.get(RequestStop), stop.reason) == (
        Rule.COST_STOP, RequestStop(by=StopBy.MAX_COST), "max_cost $5.00 reached ($5.00 so far): stop requested")
    (ended,) = check.decide(costing(2.5, exits={"j": [report(0, 143, "stopped", stopped_by="max-cost")]}), NOW, POLICY)
    assert (ended.rule, ended.to, ended.terminate) == (Rule.COST_STOPPED, State.FAILED, ("i-j-1-0",))
    assert ended.reason == "stopped at its max_cost: $5.00 of $5.00 (max_cost)"
    (late,) = check.decide(costing(2.5 + 601 / 3600), NOW, POLICY)  # the stop grace's worth later (10 min)
    assert (late.rule, late.to) == (Rule.COST_STOPPED, State.FAILED)
    assert job_cost.numbers(costing(0.1).records["j"], POLICY) == {"costleft": 500, "centsph": 200}
    assert job_cost.numbers(record(), POLICY) == {}, "no max_cost: its marker carries nothing more"
