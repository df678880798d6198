"""The reconcilers' I/O: build snapshots from the registry and the cloud, apply decided actions.

Every run reads, decides (jobplane.decide, pure) and applies. Applying is idempotent and safe under
overlap: each job action is a CAS transition with the state and attempt the run saw (a run that lost the
race is refused and skips the rest of that action), relaunches are claimed by the launcher's CAS, and
terminating, marker writes and deletes are harmless to repeat. Dry-run and blast-radius refusals are
logged and counted, never applied.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import replace
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from jobplane.clouds.base import LOG_OBJECT_TAG, Compute, PreconditionFailed
from jobplane.control.facts import Attempt, preempted, read_attempt, with_preempted, with_preempted_bodies
from jobplane.decide.effects import (
    ClearPreempted,
    DeleteKeys,
    Effect,
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
from jobplane.decide.model import Action, Snapshot, needs_old_limits
from jobplane.deployment.context import Context
from jobplane.deployment.outcome import Outcome as Outcome  # the one outcome type, named here too
from jobplane.deployment.telemetry import Metrics
from jobplane.model import keys
from jobplane.model.states import TERMINAL, State
from jobplane.store.registry import JobNotFound, Registry, TransitionRefused, UnreadableRecord

if TYPE_CHECKING:
    from jobplane.model import history  # the events' models: imported where a run writes one
    from jobplane.model.jobrecord import JobRecord  # the registry builds records: a run that lists only never does

log = logging.getLogger("jobplane.reconcile")


class Result(StrEnum):
    APPLIED = "applied"
    DRY_RUN = "dry-run"  # the run (or the policy) said dry-run: logged only
    REFUSED = "refused"  # the safety limits refused it: logged, counted and recorded on the job, never run
    SKIPPED = "skipped"  # another run acted first (a refused CAS, or the action's flag exists)
    ERROR = "error"  # applying it raised; the other actions of the run go on


def summary(outcomes: Iterable[Outcome]) -> dict[str, Any]:
    """What a handler returns: one line per action."""
    return {"actions": [{"rule": str(o.acted.rule), "job_id": o.acted.job_id, "result": str(o.result),
                         "detail": o.detail, "reason": o.acted.reason} for o in outcomes]}


# ---- snapshots ---------------------------------------------------------------------------------------------
def listings(reg: Registry, compute: Compute | None) -> Snapshot:
    """Everything a run can know without a per-job GET: the listings of active/ and heartbeats/ and the managed VMs;
    and the old limits/ keys only while a marker or a VM may need them (decide.model.needs_old_limits). The
    preempted-jobs/ markers are the check's to list when it needs them (`with_preempted`)."""
    beats, idle = reg.heartbeat_listing()
    markers, idle_flags, held = reg.active_listing()
    snap = Snapshot(
        active={job_id: tuple(found) for job_id, found in markers.items()},
        beats=tuple(beats),
        instances=tuple(compute.list_managed()) if compute is not None else (),
        idle=tuple(idle),
        idle_flags=frozenset(idle_flags),
        held=tuple(held),
    )
    if not needs_old_limits(snap):
        return snap
    old = [key for key, _, _ in reg.listing(keys.LIMITS)]
    return replace(snap, limits=tuple(lim for key in old if (lim := keys.parse_limits(key))),
                   old_idle_flags=frozenset(flag for key in old if (flag := keys.parse_idle_flag(key, old=True))),
                   held=snap.held + tuple(h for key in old if (h := keys.parse_held(key, old=True))))


def with_records(reg: Registry, snap: Snapshot, job_ids: Iterable[str], *, exits: bool = True,
                 metrics: Metrics | None = None) -> Snapshot:
    """Fetch job.json (and the current attempt's exit reports and boot failure, within bounds: control.facts) for
    just these jobs. A job.json
    that does not parse leaves that job alone (an `unreadable-record` event, once, and the UnreadableRecords
    metric) and the others go on."""
    records: dict[str, JobRecord] = {}
    found: dict[str, Attempt] = {}
    bad: set[str] = set()
    for job_id in sorted(set(job_ids)):
        try:
            record = records[job_id] = reg.job(job_id)
        except JobNotFound:
            log.warning("job %s has registry keys but no job.json", job_id, extra={"job_id": job_id})
            continue
        except UnreadableRecord as exc:
            log.error("%s", exc, extra={"job_id": job_id})
            bad.add(job_id)
            with contextlib.suppress(Exception):  # noting it must not stop the run either
                reg.note_unreadable(exc)
            continue
        reg.complete_history(record)  # the event of its last write, if the writer died before the event object
        if exits and record.state in (State.LAUNCHING, State.RUNNING) and record.attempt:
            found[job_id] = read_attempt(reg, job_id, record.attempt, record.spec.num_nodes)
    if bad and metrics is not None:
        metrics.add_metric("UnreadableRecords", "Count", len(bad))
    return replace(snap, records={**snap.records, **records},
                   exits={**snap.exits, **{j: a.exits for j, a in found.items()}},
                   boot_failures={**snap.boot_failures,
                                  **{j: a.boot_failure for j, a in found.items() if a.boot_failure}},
                   unreadable={**snap.unreadable, **{j: a.unreadable for j, a in found.items() if a.unreadable}},
                   noted=snap.noted.union(*(a.noted for a in found.values())),
                   unreadable_records=snap.unreadable_records | bad)


# ---- applying ----------------------------------------------------------------------------------------------
class AlreadyDone(Exception):
    """The action's flag exists: another run took this action."""


REFUSAL_EVENTS = 20  # per run: a refused mass termination (every VM an orphan) writes no more history than this


def apply(ctx: Context, actions: Iterable[Action], *, now: datetime) -> list[Outcome]:
    outcomes: list[Outcome] = []
    refusals = 0
    for action in actions:
        outcome = _outcome(ctx, action, now=now)
        if outcome.result == Result.REFUSED and refusals < REFUSAL_EVENTS:
            refusals += 1  # the log and the metric still count every refusal
            from jobplane.model import history  # the events: loaded by the first run that writes one
            _history(ctx.registry, action, history.Refused(rule=str(action.rule), reason=action.reason,
                                                           refused=action.refused, instances=list(action.terminate)),
                     now)
        _count(outcome, ctx.metrics)
        outcomes.append(outcome)
    return outcomes


def _outcome(ctx: Context, action: Action, *, now: datetime) -> Outcome:
    extra = {"job_id": action.job_id, "rule": str(action.rule)}
    if action.refused:
        log.warning("refused %s: %s (%s)", action.rule, action.reason, action.refused, extra=extra)
        return Outcome.of(action, Result.REFUSED, action.refused)
    if ctx.looking:
        log.info("dry-run: would %s: %s", action.rule, action.reason, extra=extra)
        return Outcome.of(action, Result.DRY_RUN)
    try:
        for effect in action.effects:  # in effects.ORDER: a refused transition or a taken flag skips the rest
            _effect(ctx, action, effect, now=now)
    except (TransitionRefused, AlreadyDone) as exc:
        log.info("skipped %s: %s", action.rule, exc, extra=extra)  # another run acted first
        return Outcome.of(action, Result.SKIPPED, str(exc))
    except Exception as exc:
        log.exception("%s failed: %s", action.rule, action.reason, extra=extra)
        return Outcome.of(action, Result.ERROR, f"{type(exc).__name__}: {exc}")
    log.info("%s: %s", action.rule, action.reason, extra=extra)
    return Outcome.of(action, Result.APPLIED)


def _history(reg: Registry, action: Action, event: history.Applied, now: datetime) -> None:
    """Add what the applier did (or refused to do) to the job's events. An action decided without the job's
    record (an orphan, a capped VM, a stop) may name a job that has none: its events go only where one is."""
    job_id = action.job_id
    if not job_id or (action.expect_attempt is None and not reg.exists(job_id)):
        return
    try:
        reg.record_event(job_id, event, now=now)
    except Exception:  # the history is worth a log line, never the action itself
        log.exception("could not record a %s event", event.kind, extra={"job_id": job_id})


def _effect(ctx: Context, action: Action, effect: Effect, *, now: datetime) -> None:
    from jobplane.model import history  # the events: with the record's models, which an action's job has loaded

    reg, job_id, attempt = ctx.registry, action.job_id, action.expect_attempt
    match effect:
        case Transition(to=to, updates=updates) if job_id:
            reg.transition(job_id, to, now=now, reason=action.reason, cause=action.rule, expect=action.expect,
                           expect_attempt=attempt, **updates)
        case Flag(key=key):
            try:
                reg.put_if_absent(key, b"", "text/plain")
            except PreconditionFailed:
                raise AlreadyDone(f"{key} exists: flagged by another run") from None
        case Note(event=event) if job_id:
            reg.record_event(job_id, event, now=now)
        case Publish(notice=notice) if ctx.notify is not None:
            ctx.notify.publish(notice)
        case RepairMarkers() if job_id:
            reg.repair_markers(job_id)
        case SaveConsole(vms=vms, data=data) if vms and job_id and attempt is not None:
            for rank, instance_id in vms:
                save_console(reg, ctx.cloud("read console output with"), data or keys.JobData(job_id), attempt, rank,
                             instance_id)
        case Terminate(instances=instances) if instances:
            ctx.cloud("terminate with").terminate(list(instances))
            _history(reg, action, history.Terminated(rule=str(action.rule), reason=action.reason,
                                                     instances=list(instances)), now)
        case Hold(held=held):
            reg.put(held.key, b"", "text/plain")
        case EndHold() if job_id:
            reg.close_usage(job_id, now=now)
        case MarkPreempted(marker=marker) if job_id:
            reg.mark_preempted(job_id, marker)
        case WriteLimits(limits=limits) if job_id:
            reg.update(job_id, now=now, limits=limits.tail)
        case RequestStop(by=by) if job_id:
            reg.request_stop(job_id, by=by, reason=action.reason, now=now)
            _history(reg, action, history.StopRequested(rule=str(action.rule), reason=action.reason, by=by), now)
        case Relaunch(retry=retry) if job_id and attempt is not None:
            ctx.cloud("relaunch with")
            from jobplane.control import launcher  # only a relaunch or a resume launches: uptime-cap never does

            launcher.launch_attempt(ctx, job_id, now=now, expect=action.relaunch_expect, expect_attempt=attempt,
                                    reason=action.reason, cause=action.rule, retry=retry)
        case ResumeLaunch(stamp=stamp) if job_id and attempt is not None:
            ctx.cloud("launch with")
            from jobplane.control import launcher  # only a relaunch or a resume launches: uptime-cap never does

            launcher.resume(ctx, job_id, attempt=attempt, stamp=stamp, now=now)
        case ClearPreempted() if job_id:
            reg.clear_preempted(job_id)
        case DeleteKeys(keys=dead):
            for key in dead:
                reg.delete(key)


def save_console(reg: Registry, compute: Compute, data: keys.JobData, attempt: int, rank: int,
                 instance_id: str) -> None:
    """Keep a VM's console output with the job's logs (create-only: the first save wins), so `jobplane logs`
    shows why its agent never started. A VM whose console cannot be read gets a note saying so."""
    job_id = data.job_id
    try:
        text = compute.console_output(instance_id)
    except Exception as exc:  # the check goes on; the reason still names where to look
        log.warning("console output of %s: %s", instance_id, exc, extra={"job_id": job_id})
        text = f"(not available: {exc})\n"
    header = f"---- console output of {instance_id} (rank {rank}, attempt {attempt}), saved by the sweeper ----\n"
    with contextlib.suppress(PreconditionFailed):  # an overlapping run saved it
        reg.put_if_absent(keys.console_log(data, attempt, rank), (header + text).encode(),
                                "text/plain", tags=dict([LOG_OBJECT_TAG]))


def _count(outcome: Outcome, metrics: Metrics) -> None:
    action = outcome.acted
    if outcome.result == Result.REFUSED:
        metrics.add_metric("BlastRadiusRefusals", "Count", 1)
    elif outcome.result == Result.ERROR:
        metrics.add_metric("ActionErrors", "Count", 1)
    if outcome.result != Result.APPLIED:
        return
    facts = action.rule.facts  # the rule's metric (decide.rules), once or per termination
    if facts.metric:
        metrics.add_metric(facts.metric, "Count", len(action.terminate) if facts.per_termination else 1)
    if action.to == State.SUCCEEDED:
        metrics.add_metric("JobsSucceeded", "Count", 1)
    elif action.to == State.FAILED:
        metrics.add_metric("JobsFailed", "Count", 1)


# ---- the three reconcilers: the check, rerun, uptime cap ---------------------------------------------------
def check(ctx: Context, *, now: datetime, force: bool = False, jobs: Collection[str] = (),
          instance_ids: Collection[str] = ()) -> list[Outcome]:
    """One check: the scheduled health pass over every live job and managed VM. `jobs` / `instance_ids` (from an
    exit-report or instance state-change event) are looked at closely even if their listings look healthy. The
    context's notifier publishes idle-GPU flags (a job's end is announced by the registry's transition listener)."""
    from jobplane.decide import check as check_decide  # each reconciler imports its own rules, not the others'

    reg, policy, started = ctx.registry, ctx.policy, time.monotonic()
    snap = listings(reg, ctx.compute)
    named = {i.job_id for i in snap.instances if i.id in instance_ids and i.job_id}
    snap = replace(snap, forced=frozenset({*jobs, *named}))
    reading = check_decide.candidates(snap, now, policy)
    snap = with_records(reg, with_preempted(reg, snap, reading), reading, metrics=ctx.metrics)
    snap = with_preempted_bodies(reg, snap, only=set(snap.records))
    outcomes = apply(ctx, check_decide.decide(snap, now, policy, force=force), now=now)
    settle_admissions(ctx, snap, now=now, ended=ended(outcomes))
    ctx.metrics.add_metric("CheckDuration", "Milliseconds", (time.monotonic() - started) * 1000)
    return outcomes


def ended(outcomes: Iterable[Outcome]) -> list[str]:
    """The jobs a run's applied actions ended."""
    return [o.acted.job_id for o in outcomes
            if o.result == Result.APPLIED and o.acted.to in TERMINAL and o.acted.job_id]


def settle_admissions(ctx: Context, snap: Snapshot | None, *, now: datetime, ended: Collection[str] = ()) -> None:
    """After a run's actions: the jobs waiting for the ones it ended go on (their `after:`), the quota reservations
    no live job holds are given back (with the sweep's listings), the waiting jobs the freed nodes admit are
    launched, in order, and owners whose spend reached a level of their budget are told, once a month
    (jobplane.control.admission)."""
    from jobplane.control import admission, launcher  # only a run that may have freed nodes admits

    if ctx.looking:
        return
    try:
        launcher.release_dependents(ctx, ended, now)
    except Exception:  # they go on at their backoff's retry
        log.exception("releasing the jobs waiting for %s failed", ended)
    try:
        dropped, lines = ({}, admission.owners(ctx.registry)) if snap is None else \
            admission.reclaim(ctx.registry, snap, ctx.policy, now, ctx.cloud("price its VMs").cloud)
        launched = launcher.admit_in_order(ctx, lines, now)
        told = admission.budget_notices(ctx.registry, lines, ctx.policy, now) if ctx.notify is not None else []
    except Exception:  # the quotas wait for the next run; this run's own work is done
        log.exception("settling the admissions failed")
        return
    if ctx.notify is not None:
        for notice in told:
            ctx.notify.publish(notice)
    if dropped:
        ctx.metrics.add_metric("AdmissionsReclaimed", "Count", sum(map(len, dropped.values())))
    if launched:
        ctx.metrics.add_metric("AdmittedInOrder", "Count", len(launched))


def rerun(ctx: Context, *, now: datetime, jobs: Collection[str] = ()) -> list[Outcome]:
    """Relaunch (or fail) every preempted job, or just `jobs` when an event named them."""
    from jobplane.decide import rerun as rerun_decide  # each reconciler imports its own rules, not the others'

    reg = ctx.registry
    marks = {job_id: mark for job_id, mark in preempted(reg).items() if not jobs or job_id in jobs}
    # the cloud's listing, to check the markers against (job.json's instances cover VMs already gone)
    instances = tuple(ctx.cloud("list instances with").list_managed()) if marks else ()
    snap = with_preempted_bodies(reg, Snapshot(preempted=marks, instances=instances))
    snap = with_records(reg, snap, snap.preempted, exits=False, metrics=ctx.metrics)
    return apply(ctx, rerun_decide.decide(snap, now, ctx.policy), now=now)


def uptime_cap(ctx: Context, *, now: datetime, force: bool = False) -> list[Outcome]:
    from jobplane.decide import uptime as uptime_decide  # each reconciler imports its own rules, not the others'

    snap = listings(ctx.registry, ctx.compute)
    snap = with_records(ctx.registry, snap, uptime_decide.needs_record(snap), exits=False, metrics=ctx.metrics)
    outcomes = apply(ctx, uptime_decide.decide(snap, now, ctx.policy, force=force), now=now)
    if done := ended(outcomes):
        settle_admissions(ctx, None, now=now, ended=done)  # a job it ended freed its nodes
    return outcomes


def record_spot_warning(reg: Registry, compute: Compute, instance_id: str, *, now: datetime,
                        detail: dict[str, Any] | None = None) -> str:
    """An EC2 Spot interruption warning: note it on the job at once (the agent does the graceful part)."""
    from jobplane.model import history  # the events: with the record's models, which reading the job loads

    inst = next((i for i in compute.list_managed() if i.id == instance_id), None)
    if inst is None or inst.job_id is None:
        log.info("spot warning for %s: not a managed instance of a job", instance_id)
        return "ignored"
    job_id = inst.job_id
    record = reg.job(job_id)
    if any(n.get("instance_id") == instance_id for n in record.notices):
        return "duplicate"
    warning = history.SpotWarning(instance_id=instance_id, attempt=inst.attempt, rank=inst.rank,
                                  action=(detail or {}).get("instance-action"), received_at=now.isoformat())
    reg.update(job_id, now=now, notices=[*record.notices, warning.body()])
    reg.record_event(job_id, warning, now=now)
    log.warning("Spot interruption warning for %s (rank %s of attempt %s)", instance_id, inst.rank, inst.attempt,
                extra={"job_id": job_id})
    return "recorded"
