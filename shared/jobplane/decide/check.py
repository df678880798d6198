"""The check's decisions (the scheduled health pass over live jobs and managed VMs; a sweep is a hyperparameter
search): finished, a failed rank, started, stalled, boot timeout, lost ranks, orphans, ignored facts, housekeeping;
and, for an attempt that ends in an error the spec's retry: names, a retry (decide.retry).

Two pure steps. `candidates` reads listings only and names the jobs that need a closer look; the
caller fetches job.json and the exit reports of just those; `decide` turns the whole snapshot into
actions, filtered by the blast-radius limit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from jobplane.clouds.base import Instance
from jobplane.decide import job_cost
from jobplane.decide.effects import (
    DeleteKeys,
    EndHold,
    Flag,
    Hold,
    MarkPreempted,
    Note,
    Publish,
    Relaunch,
    RepairMarkers,
    RequestStop,
    ResumeLaunch,
    SaveConsole,
    Terminate,
    Transition,
    WriteLimits,
)
from jobplane.decide.jobrule import JobRule, Listed, Seen
from jobplane.decide.model import (
    Action,
    ExitReport,
    Held,
    Ignored,
    Index,
    Limits,
    Rule,
    Snapshot,
    age,
    alive,
    attempt_instances,
    attempts_spent,
    claim,
    ignore,
    trusted_mark,
)
from jobplane.decide.retry import Trigger, exit_code
from jobplane.decide.rules import ORDER
from jobplane.decide.safety import limit_blast_radius, terminable
from jobplane.model import keys
from jobplane.model.bounds import format_duration
from jobplane.model.policy import Policy
from jobplane.model.states import EARLY_STOP, HOLD_BY, State, StopBy
from jobplane.views import notices

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.jobrecord import JobRecord

# an attempt's instances are "lost" only once the launch is older than this (or the orphan grace, if
# shorter: a local cloud with a seconds-long grace detects lost ranks in seconds).
LOST_GRACE = 120
# A PREEMPTED job whose preempted-jobs/ marker is still missing this long (or the orphan grace) after the
# transition lost it to a crash between the two writes: the check writes it again.
REMARK_AFTER = 60
IDLE_BY = StopBy.IDLE_GPU  # the `by` of an idle stop request, copied by the agent into its exit report
CONSOLE_HINT = "the VM's console output is in `jobplane logs {job_id} --attempt {attempt}`"


def _fmt(seconds: float) -> str:
    return format_duration(max(1, int(seconds)))


def candidates(snap: Snapshot, now: datetime, policy: Policy) -> set[str]:
    """Jobs whose job.json (and exit reports) the decision needs; a healthy RUNNING job is never one. Every job not
    settled RUNNING is read (LAUNCHING, markers that disagree, a claim whose marker move may have died); a RUNNING
    one when a rule's candidate filter names it."""
    index = Index(snap)
    out = {job_id for job_id in snap.forced if job_id in snap.active}
    for job_id, markers in snap.active.items():
        if len(markers) != 1 or markers[0].state == State.LAUNCHING:
            out.add(job_id)
            continue
        marker = markers[0]
        if marker.state in (State.QUEUED, State.PREEMPTED) and age(now, marker.since) >= LAUNCH_GRACE:
            out.add(job_id)  # a launcher (or rerun) may have died between its claim and moving the marker
            continue
        if marker.state != State.RUNNING:
            continue  # QUEUED / WAITING_CAPACITY: the launcher's; PREEMPTED: rerun's
        n = marker.attempt
        listed = Listed(job_id, n, marker.since, index.limits.get((job_id, n)), index.beats[job_id, n],
                        index.instances[job_id, n], index, now, policy)
        if any(rule.candidate(listed) for rule in CHECKS):
            out.add(job_id)
    return out


def _silent(job: Listed) -> bool:
    """A rank without a heartbeat, one silent past the stall timeout, or no output for as long."""
    if job.limits is None:
        return False
    liveness = [b for b in job.beats if not b.output]
    if {b.rank for b in liveness} != set(range(job.limits.nodes)):
        return True
    if any(age(job.now, b.at) > job.limits.stall for b in liveness):
        return True
    return age(job.now, max((b.at for b in job.beats if b.output), default=job.since)) > job.limits.stall


def _vms_missing(job: Listed) -> bool:
    """Not exactly num_nodes VMs pending or running."""
    return job.limits is not None and (len(job.instances) != job.limits.nodes
                                       or not all(alive(i) for i in job.instances))


def _unmarked(job: Listed) -> bool:
    """Its RUNNING marker was written before markers carried the attempt's limits."""
    return (job.job_id, job.attempt) not in job.index.marked


def _idle_unflagged(job: Listed) -> bool:
    return job.limits is not None and job.policy.idle_gpu.action != "off" \
        and not job.index.flagged_idle(job.job_id, job.attempt) \
        and job.index.idle_everywhere(job.job_id, job.attempt, job.limits.nodes)


def decide(snap: Snapshot, now: datetime, policy: Policy, *, force: bool = False) -> list[Action]:
    index = Index(snap)
    actions: list[Action] = []
    for job_id in sorted(snap.records):
        actions += _job(snap.records[job_id], index, now, policy)
    actions += _orphans(index, now, policy)
    actions += _holds_over(index, now)
    actions += _remarks(snap, now, policy)
    actions += _cleanup(index, now, policy)
    actions.sort(key=lambda a: ORDER[a.rule])  # least risky first (decide.rules): the blast radius lets the head go
    return limit_blast_radius(actions, snap.instances, policy, force=force)


def _job(record: JobRecord, index: Index, now: datetime, policy: Policy) -> list[Action]:
    snap, job_id = index.snap, record.id
    markers = snap.active.get(job_id, ())
    want = [] if record.terminal else [(record.state, record.attempt)]
    out: list[Action] = []
    if [(m.state, m.attempt) for m in markers] != want:
        out.append(Action(Rule.REPAIR, job_id, Rule.REPAIR.reason(), (RepairMarkers(),)))
    if record.state not in (State.LAUNCHING, State.RUNNING):
        return out
    n = record.attempt
    instances = index.instances[job_id, n]
    exits, ignored = _trusted(record, snap, instances)
    out += [ignore(job_id, n, fact) for fact in ignored if keys.ignored_flag(job_id, n, fact.key) not in snap.noted]
    mark = snap.preempted.get(job_id)
    if mark is not None and trusted_mark(mark, record, instances):
        return out  # the agent reported a preemption: rerun's job
    seen = Seen(record, exits, index.beats[job_id, n], instances, index, now, policy)
    action = next((a for rule in CHECKS if (a := rule.decide(seen)) is not None), None)
    if action is not None and action.to == State.FAILED and record.spec.debug_hold:
        action = _held(seen, action, record.spec.debug_hold)
    return [*out, action] if action else out


def _held(job: Seen, fail: Action, hold: int) -> Action:
    """A FAILED attempt whose spec asks for a debug hold: its VMs stay up until now + hold for a look (`jobplane
    ssh`), instead of being terminated; ranks still running are asked to stop (their agents keep their VMs up
    too). The held-until key spares them from the orphan rule; _holds_over ends the hold."""
    record = job.record
    until = job.now + timedelta(seconds=hold)
    transition = fail.get(Transition)
    assert transition is not None  # fail moves the job to FAILED
    updates = transition.updates.copy()
    updates["held_until"] = until
    running = [r for r in range(record.spec.num_nodes) if r not in job.exits]
    kept = tuple(e for e in fail.effects if not isinstance(e, Transition | Terminate))
    effects = (Transition(State.FAILED, updates), Hold(Held(record.id, record.attempt, until)), *kept,
               *((RequestStop(by=HOLD_BY),) if running and job.instances else ()))
    reason = f"{fail.reason}; VMs held for debugging until {until:%Y-%m-%d %H:%M:%S} UTC (debug_hold " \
             f"{format_duration(hold)})"
    return replace(fail, reason=reason, effects=effects)


LAUNCH_GRACE = 600  # s: longer than any launcher run (Lambda 120 s; the GCP launcher waits up to 540 s)


def _resume(job: Seen) -> Action | None:
    """A claim with no VM recorded long after it, or whose VMs already beat: the launcher died between its
    claim and the launch, or after RunInstances and before recording the VMs (a timeout). Resume that
    attempt (adopting its VMs if they exist); it costs no restart."""
    record, now = job.record, job.now
    if record.state != State.LAUNCHING or record.instances or record.last_event is None:
        return None
    beating = set(range(record.spec.num_nodes)) <= {b.rank for b in job.beats if not b.output}
    if not beating and age(now, record.state_since) < LAUNCH_GRACE:
        return None
    return claim(record, Rule.RESUME_LAUNCH, Rule.RESUME_LAUNCH.reason(attempt=record.attempt,
                                                                        after=_fmt(age(now, record.state_since))),
                 ResumeLaunch(record.last_event.stamp))


def _trusted(record: JobRecord, snap: Snapshot, instances: list[Instance]) -> tuple[dict[int, ExitReport],
                                                                                  list[Ignored]]:
    """The attempt's exit reports by rank, those written by one of its instances; and what is ignored:
    reports from any other VM (every VM may write any job's reports) and those that do not parse."""
    own = attempt_instances(record, instances)
    exits: dict[int, ExitReport] = {}
    ignored = list(snap.unreadable.get(record.id, ()))
    for report in snap.exits.get(record.id, ()):
        if report.instance_id in own:
            exits[report.rank] = report
        else:
            ignored.append(Ignored(keys.exit_report(record.id, record.attempt, report.rank),
                                   f"written by {report.instance_id or 'an unnamed instance'}, not an instance of "
                                   f"attempt {record.attempt}"))
    return exits, ignored


def _limits(record: JobRecord, policy: Policy) -> Limits:
    """The attempt's limits, which its RUNNING marker's name carries: nodes, stall timeout and uptime cap, and the
    numbers the rules' filters read."""
    spec = record.spec
    facts = tuple(item for rule in CHECKS if rule.limits for item in sorted(rule.limits(record, policy).items()))
    return Limits(record.id, record.attempt, spec.num_nodes, policy.stall_timeout(spec), policy.max_runtime(spec),
                  facts)


def _ended(job: Seen) -> list[ExitReport] | None:
    """Every rank's exit report, if every rank has exited and none on a preemption (the preempted-jobs/ marker
    follows its exit report: rerun's job)."""
    ranks = range(job.record.spec.num_nodes)
    if not all(r in job.exits for r in ranks):
        return None
    reports = [job.exits[r] for r in ranks]
    return None if any(e.reason == "preempted" for e in reports) else reports


def _end(job: Seen, rule: Rule, reason: str, transition: Transition) -> Action:
    """The attempt's end: every VM of the job goes, powered-off ones too (a stopped GCE VM, or EC2 with
    stop-on-shutdown, still bills its disk)."""
    return claim(job.record, rule, reason, transition, Terminate(terminable(job.instances)))


def _early_stopped(job: Seen) -> Action | None:
    """Every rank has exited, one on a stop_on match: FAILED with it, never retried."""
    reports = _ended(job)
    early = _early_stop(reports or ())
    if reports is None or early is None:
        return None
    on = f" (rank {early.rank})" if len(reports) > 1 else ""
    return _end(job, Rule.EARLY_STOP, Rule.EARLY_STOP.reason(why=early.error or "a stop_on rule matched", rank=on),
                Transition(State.FAILED, {"exit_code": early.code}))


def _idle_stopped(job: Seen) -> Action | None:
    """Every rank has exited, one on the idle-GPU rule's stop request: STALLED."""
    reports = _ended(job) or ()
    idle_stop = next((e for e in reports if e.reason == "stopped" and e.stopped_by == IDLE_BY), None)
    if idle_stop is None:
        return None
    return _end(job, Rule.IDLE_STOPPED, Rule.IDLE_STOPPED.reason(why=idle_stop.stop_reason or "idle_gpu"),
                Transition(State.STALLED))


def _stopped(job: Seen) -> Action | None:
    """Every rank has exited, one on the uptime cap's stop request: TIMED_OUT."""
    if not any(e.reason == "stopped" for e in _ended(job) or ()):
        return None
    cap = format_duration(job.policy.max_runtime(job.record.spec))
    return _end(job, Rule.STOPPED, Rule.STOPPED.reason(cap=cap), Transition(State.TIMED_OUT))


def _finished(job: Seen) -> Action | None:
    """Every rank has exited: SUCCEEDED if every one exited 0, else FAILED, or retried on a code the spec's retry:
    names."""
    reports = _ended(job)
    if reports is None:
        return None
    failed = next((e for e in reports if e.code != 0), None)
    if failed is None:
        return _end(job, Rule.FINISHED, Rule.FINISHED.reason(exited="every rank exited 0"),
                    Transition(State.SUCCEEDED, {"exit_code": 0}))
    fail = _end(job, Rule.FINISHED, Rule.FINISHED.reason(exited=_exited(failed)),
                Transition(State.FAILED, {"exit_code": failed.code}))
    hit = exit_code(job.record.spec, reports)
    return fail if hit is None else job.retry(Trigger.EXIT_CODE, f"exit code {hit.code} (rank {hit.rank})",
                                              reports, fail)


def _exited(report: ExitReport) -> str:
    return f"rank {report.rank} exited with code {report.code}" + (f": {report.error}" if report.error else "")


def _rank_failed(job: Seen) -> Action | None:
    """A rank of a multi-node attempt exited non-zero while others still run: they would wait in their next
    collective until its timeout, then the stall timeout or the uptime cap. The attempt ends now: the other
    ranks are terminated and the job fails (max_restarts reruns preemptions and failed boots, not errors), or,
    on a code the spec's retry: names, is retried."""
    record, exits = job.record, job.exits
    failed = next((exits[r] for r in sorted(exits) if exits[r].reason == "exit" and exits[r].code != 0), None)
    running = [r for r in range(record.spec.num_nodes) if r not in exits]
    if failed is None or not running or any(e.reason == "preempted" for e in exits.values()):
        return None  # no failure, or every rank has exited (_finished), or rerun's
    why = Rule.RANK_FAILED.reason(exited=_exited(failed), running=", ".join(map(str, running)))
    fail = claim(record, Rule.RANK_FAILED, why, Transition(State.FAILED, {"exit_code": failed.code}),
                 Terminate(terminable(job.instances)))
    hit = exit_code(record.spec, exits.values())
    return fail if hit is None else job.retry(Trigger.EXIT_CODE, f"exit code {hit.code} (rank {hit.rank})",
                                              exits.values(), fail)


def _early_stop(reports: Iterable[ExitReport]) -> ExitReport | None:
    return next((e for e in reports if e.reason == EARLY_STOP), None)


def _stop_peers(job: Seen) -> Action | None:
    """A rank stopped on a stop_on match while others run (a rank that prints no loss would wait in its next
    collective until a timeout): they get a stop request, so they checkpoint and exit too. Asked again each
    check until every rank has reported; a repeated request is harmless."""
    record = job.record
    early = _early_stop(job.exits.values())
    running = [r for r in range(record.spec.num_nodes) if r not in job.exits]
    if early is None or not running or record.state != State.RUNNING:
        return None
    return claim(record, Rule.STOP_PEERS, Rule.STOP_PEERS.reason(rank=early.rank, error=early.error,
                                                                 running=", ".join(map(str, running))),
                 RequestStop(by=StopBy.CHECK))


def _unstarted(job: Seen) -> list[int]:
    """Ranks whose agent has not sent a heartbeat."""
    beaten = {b.rank for b in job.beats if not b.output}
    return [r for r in range(job.record.spec.num_nodes) if r not in beaten]


def _consoles(record: JobRecord, ranks: list[int]) -> SaveConsole:
    return SaveConsole(tuple((r, record.instances[r]) for r in ranks if r < len(record.instances)), record.data)


def _bootstrap_failed(job: Seen) -> Action | None:
    """A VM's bootstrap said why the agent cannot start (no bundle for its Python, download or checksum
    failure): retrying the same image would fail the same way, so the job fails now, with that reason."""
    record = job.record
    report = job.index.snap.boot_failures.get(record.id)
    if report is None or record.state != State.LAUNCHING:
        return None
    hint = CONSOLE_HINT.format(job_id=record.id, attempt=record.attempt)
    return claim(record, Rule.BOOT_FAILED, Rule.BOOT_FAILED.reason(why=f"the agent could not start: {report} ({hint})"),
                 Transition(State.FAILED), Terminate(terminable(job.instances)), _consoles(record, _unstarted(job)))


def _started(job: Seen) -> Action | None:
    record = job.record
    if record.state != State.LAUNCHING or _unstarted(job):
        return None
    return claim(record, Rule.STARTED, Rule.STARTED.reason(),
                 Transition(State.RUNNING, {"limits": _limits(record, job.policy).tail}))


def _lost_ranks(job: Seen) -> list[tuple[int, str]]:
    """Ranks (and their VMs) gone from the cloud's listing without an exit report, once the launch is past the
    grace."""
    record = job.record
    launched = record.launched_at or record.state_since
    if not record.instances or age(job.now, launched) < min(LOST_GRACE, job.policy.safety.orphan_grace):
        return []
    live = {i.id for i in job.instances if alive(i)}
    return [(r, iid) for r, iid in enumerate(record.instances) if iid not in live and r not in job.exits]


def _survivors(job: Seen) -> Terminate:
    return Terminate(terminable(i for i in job.instances if alive(i)))


def _lost_spot(job: Seen) -> Action | None:
    """A Spot job's rank gone: its capacity was taken back. PREEMPTED, marked for rerun."""
    record = job.record
    lost = _lost_ranks(job) if record.spec.spot else []
    if not lost:
        return None
    from jobplane.model.records import PreemptedMarker  # the agents' records: only a run that writes one needs them

    rank, iid = lost[0]
    return claim(record, Rule.LOST_SPOT, Rule.LOST_SPOT.reason(what=_what(lost)), Transition(State.PREEMPTED),
                 _survivors(job), MarkPreempted(PreemptedMarker(attempt=record.attempt, rank=rank, instance_id=iid,
                                                                by="sweeper")))


def _lost(job: Seen) -> Action | None:
    """An on-demand job's rank gone: FAILED, or retried on `on_lost`."""
    record = job.record
    lost = [] if record.spec.spot else _lost_ranks(job)
    if not lost:
        return None
    why = Rule.LOST.reason(what=_what(lost))
    return job.retry(Trigger.LOST, why, job.exits.values(),
                     claim(record, Rule.LOST, why, Transition(State.FAILED), _survivors(job)))


def _what(lost: list[tuple[int, str]]) -> str:
    return ", ".join(f"rank {r} ({iid})" for r, iid in lost)


def _boot_timeout(job: Seen) -> Action | None:
    record = job.record
    timeout = job.policy.boot_timeout(record.spec)
    if record.state != State.LAUNCHING or age(job.now, record.launched_at or record.state_since) <= timeout:
        return None
    missing = _unstarted(job)
    why = (f"the agent never started: no heartbeat from rank {', '.join(map(str, missing))} within boot_timeout "
           f"{format_duration(timeout)} ({CONSOLE_HINT.format(job_id=record.id, attempt=record.attempt)})")
    doomed, consoles = Terminate(terminable(job.instances)), _consoles(record, missing)
    if record.restarts >= record.spec.max_restarts:
        spent = f"no restarts left (max_restarts {record.spec.max_restarts})"
    elif record.attempt >= job.policy.max_attempts(record.spec):
        spent = attempts_spent(record, job.policy)
    elif age(job.now, record.created_at) > (max_wait := job.policy.max_wait(record.spec)):
        spent = f"max_wait {format_duration(max_wait)} exceeded"  # no attempt starts after it, as a rerun's
    else:
        return claim(record, Rule.BOOT_RETRY, Rule.BOOT_RETRY.reason(why=why, next=record.attempt + 1),
                     doomed, Relaunch(), consoles)
    return claim(record, Rule.BOOT_FAILED, Rule.BOOT_FAILED.reason(why=f"{why}; {spent}"),
                 Transition(State.FAILED), doomed, consoles)


def _stalled(job: Seen) -> Action | None:
    record, now = job.record, job.now
    if record.state != State.RUNNING:
        return None
    stall = job.policy.stall_timeout(record.spec)
    why = None
    for rank in range(record.spec.num_nodes):
        last = max((b.at for b in job.beats if b.rank == rank and not b.output), default=record.state_since)
        if rank not in job.exits and age(now, last) > stall:
            why = f"no heartbeat from rank {rank} for {_fmt(age(now, last))}"
            break
    last_output = max((b.at for b in job.beats if b.output), default=record.state_since)
    if why is None and age(now, last_output) > stall:
        why = f"no new output for {_fmt(age(now, last_output))}"
    if why is None:
        return None
    why = Rule.STALLED.reason(why=why, stall=format_duration(stall))
    return job.retry(Trigger.STALLED, f"stalled: {why}", job.exits.values(),
                     claim(record, Rule.STALLED, why, Transition(State.STALLED), Terminate(terminable(job.instances))))


def _write_limits(job: Seen) -> Action | None:
    """A RUNNING attempt whose marker was written before markers carried the limits: record them (those of its old
    limits/ key, if listed, else the record's and the policy's), so its marker is renamed to carry them, and move
    its idle flag out of limits/ (its creation claims the move from an overlapping check)."""
    record, index, n = job.record, job.index, job.record.attempt
    if record.state != State.RUNNING or (record.id, n) in index.marked:
        return None
    old = next((lim for lim in index.snap.limits if (lim.job_id, lim.attempt) == (record.id, n)), None)
    flagged = (record.id, n) in index.snap.old_idle_flags
    gone = (*((old.key,) if old else ()), *((keys.idle_flag(record.id, n, old=True),) if flagged else ()))
    return claim(record, Rule.LIMITS, Rule.LIMITS.reason(), *((Flag(keys.idle_flag(record.id, n)),) if flagged else ()),
                 WriteLimits(old or _limits(record, job.policy)), *((DeleteKeys(gone),) if gone else ()))


def _idle(job: Seen) -> Action | None:
    """Idle GPUs on every rank over the policy window: flag the attempt once (event, metric, notification) and,
    with idle_gpu.action stop, ask the agents to stop (they checkpoint; the job then ends STALLED)."""
    record, rule, n = job.record, job.policy.idle_gpu, job.record.attempt
    if record.state != State.RUNNING or rule.action == "off" or job.index.flagged_idle(record.id, n) \
            or not job.index.idle_everywhere(record.id, n, record.spec.num_nodes):
        return None
    from jobplane.model import history  # the events: with the record's models, which a job's rule has loaded

    stopping = rule.action == "stop"
    why = Rule.IDLE.reason(threshold=rule.threshold, window=format_duration(rule.window), then="")
    return claim(record, Rule.IDLE, Rule.IDLE.reason(threshold=rule.threshold, window=format_duration(rule.window),
                                                     then="; stop requested" if stopping else ""),
                 Flag(keys.idle_flag(record.id, n)),
                 Note(history.IdleGpu(attempt=n, reason=why, action=rule.action, threshold=rule.threshold,
                                      window=rule.window)),
                 Publish(notices.idle(record, why, stopping, job.now)),
                 *((RequestStop(by=IDLE_BY),) if stopping else ()))


# The rules over a live job, by precedence: the first that decides anything is its action this check (where an
# action stands among all the check's actions is its rule's risk order, decide.rules). The candidates a check reads
# are derived from their filters.
CHECKS: tuple[JobRule, ...] = (
    JobRule(Rule.RESUME_LAUNCH, _resume),
    JobRule(Rule.EARLY_STOP, _early_stopped),
    JobRule(Rule.IDLE_STOPPED, _idle_stopped),
    job_cost.ENDED,
    JobRule(Rule.STOPPED, _stopped),
    JobRule(Rule.FINISHED, _finished, also=(Rule.RETRY,)),
    JobRule(Rule.RANK_FAILED, _rank_failed, also=(Rule.RETRY,)),
    JobRule(Rule.BOOT_FAILED, _bootstrap_failed),
    JobRule(Rule.STARTED, _started),
    JobRule(Rule.LOST_SPOT, _lost_spot, _vms_missing),
    JobRule(Rule.LOST, _lost, _vms_missing, also=(Rule.RETRY,)),
    JobRule(Rule.BOOT_RETRY, _boot_timeout, also=(Rule.BOOT_FAILED,)),
    JobRule(Rule.STALLED, _stalled, _silent, also=(Rule.RETRY,)),
    job_cost.RULE,
    JobRule(Rule.STOP_PEERS, _stop_peers),
    JobRule(Rule.LIMITS, _write_limits, _unmarked),
    JobRule(Rule.IDLE, _idle, _idle_unflagged),
)


def _orphans(index: Index, now: datetime, policy: Policy) -> Iterable[Action]:
    grace = policy.safety.orphan_grace
    held = {(h.job_id, h.attempt) for h in index.snap.held}
    for inst in index.snap.instances:
        if not terminable([inst]) or age(now, inst.launched_at) < grace:
            continue  # unmanaged, protected, gone, or possibly a launch in flight
        if (inst.job_id, inst.attempt) in held:
            continue  # a FAILED attempt's debug hold keeps it: _holds_over ends it
        current = index.current_attempt(inst.job_id)
        if current is not None and inst.attempt == current:
            continue
        if inst.job_id is None:
            why = "managed instance without a job id"
        elif current is None:
            why = f"job {inst.job_id} is not live"
        else:
            why = f"attempt {inst.attempt} is not job {inst.job_id}'s current attempt {current}"
        yield Action(Rule.ORPHAN, inst.job_id, Rule.ORPHAN.reason(instance=inst.id, why=why), (Terminate((inst.id,)),))


def _holds_over(index: Index, now: datetime) -> Iterable[Action]:
    """Debug holds whose time is up: the VMs they kept are terminated (by the same rules as any: ownership tags,
    the blast-radius limit), job.json stops counting their time, and the held-until key goes."""
    for held in index.snap.held:
        if now < held.until:
            continue
        doomed = terminable(index.instances[held.job_id, held.attempt])  # a stopped VM still bills its disk
        reason = Rule.HOLD_OVER.reason(attempt=held.attempt, until=f"{held.until:%Y-%m-%d %H:%M:%S} UTC",
                                       instances=", ".join(doomed) or "nothing (its VMs are gone)")
        yield Action(Rule.HOLD_OVER, held.job_id, reason, (Terminate(doomed), EndHold(), DeleteKeys((held.key,))),
                     expect_attempt=held.attempt)


def _remarks(snap: Snapshot, now: datetime, policy: Policy) -> Iterable[Action]:
    for job_id, markers in snap.active.items():
        if len(markers) == 1 and markers[0].state == State.PREEMPTED and job_id not in snap.preempted \
                and age(now, markers[0].since) > min(REMARK_AFTER, policy.safety.orphan_grace):
            from jobplane.model.records import PreemptedMarker  # the agents' records: only a remark writes one

            yield Action(Rule.REMARK, job_id, Rule.REMARK.reason(),
                         (MarkPreempted(PreemptedMarker(attempt=markers[0].attempt, by="sweeper")),))


def _cleanup(index: Index, now: datetime, policy: Policy) -> Iterable[Action]:
    """Heartbeats and idle flags of attempts that are no longer current, and old limits/ keys (as listed) of those or
    of attempts whose marker now carries its limits, so the listings stay the size of the live working set.
    Heartbeats wait out the orphan grace (a late agent write is harmless either way)."""
    stale: defaultdict[str, list[str]] = defaultdict(list)
    for (job_id, attempt), beats in index.beats.items():
        if attempt != index.current_attempt(job_id) and all(age(now, b.at) > policy.safety.orphan_grace
                                                            for b in beats):
            stale[job_id] += [(keys.output_mark if b.output else keys.heartbeat)(job_id, attempt, b.rank)
                              for b in beats]
    for (job_id, attempt), marks in index.idle.items():
        if attempt != index.current_attempt(job_id) and all(age(now, m.at) > policy.safety.orphan_grace
                                                            for m in marks):
            stale[job_id] += [keys.idle_mark(job_id, attempt, m.rank) for m in marks]
    for lim in index.snap.limits:
        if lim.attempt != index.current_attempt(lim.job_id) or (lim.job_id, lim.attempt) in index.marked:
            stale[lim.job_id].append(lim.key)
    for flags, old in ((index.snap.idle_flags, False), (index.snap.old_idle_flags, True)):
        for job_id, attempt in sorted(flags):
            if attempt != index.current_attempt(job_id):
                stale[job_id].append(keys.idle_flag(job_id, attempt, old=old))
    for job_id, dead in sorted(stale.items()):
        yield Action(Rule.CLEANUP, job_id, Rule.CLEANUP.reason(count=len(dead)), (DeleteKeys(tuple(dead)),))
