"""The sweep reconcile: for each sweep with work left, read its record and its trials, decide
(jobplane.decide.trials.plan, pure) and apply. It runs in the sweeper's invocation after the job sweep (so a trial
that sweep saw end is replaced in the same run), on the schedule, and once for a new sweep when the launcher
records it.

Applying, in an order a crash anywhere can resume from:
1. The record by compare-and-swap: proposals appended, trials seen to end with their outcome, early stops, the
   best so far, the end. A run that loses the race re-reads and decides again on the winner's record, so two
   runs never propose one trial number twice, nor more than max_trials.
2. The proposed trials' queue drops, create-only. A trial of the record with no job and no drop a minute after it
   was proposed (its proposer died after step 1, or its drop was overwritten and refused) gets its drop written
   again. The launcher takes a drop as a trial only as the record made it (jobplane.decide.members).
3. The early stops the record names whose trial is still live, handed back as actions (rule `sweep-early-stop`: a
   CAS to CANCELLED, the stop request, and the VMs of a trial not yet running terminated at once) for the scheduled
   pass to apply as it applies the check's (jobplane.control.scheduled): the blast-radius limit, dry-run and the
   job's events hold for them as for every stop.
4. The marker goes once the sweep has ended (or, cancelled, once no trial is live).
Dry-run (the invocation's or the policy's) decides and reports, and writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import yaml

from jobplane.clouds.base import Compute, PreconditionFailed
from jobplane.decide import trials as decide
from jobplane.decide.effects import RequestStop, Terminate, Transition
from jobplane.decide.model import Action, claim
from jobplane.decide.rules import Rule
from jobplane.deployment.context import Context
from jobplane.deployment.outcome import Outcome as Outcome  # the one outcome type, named here too
from jobplane.model import keys, records
from jobplane.model.errors import SpecError
from jobplane.model.jobrecord import JobRecord
from jobplane.model.spec import JobSpec
from jobplane.model.states import LIVE, NOT_STARTED, State
from jobplane.store.registry import JobExists, JobNotFound, Registry, UnreadableRecord
from jobplane.sweeps import curves, store
from jobplane.sweeps.record import SweepRecord, SweepState, Trial

log = logging.getLogger("jobplane.sweeps")
DROP_GRACE = timedelta(minutes=1)  # a proposer writes its drops right after its record: one missing later, it died


class Result(StrEnum):
    PROPOSED = "proposed"  # a trial added to the record and its drop written
    DROPPED_AGAIN = "dropped-again"  # a proposed trial had no job and no drop: its drop written again
    CANCELLED = "cancelled"  # a trial of a cancelled sweep
    ENDED = "ended"  # the sweep ended: COMPLETED or FAILED (the detail says which and why)
    DRY_RUN = "dry-run"  # what a run that acts would have done
    ERROR = "error"  # this sweep's run raised; the other sweeps go on


@dataclass
class Run:
    """What a sweep reconcile run did to the sweeps, and the early stops it decided: actions on their trials, which
    the scheduled pass applies with the check's."""

    outcomes: list[Outcome] = field(default_factory=list)
    stops: list[Action] = field(default_factory=list)

    def __iadd__(self, other: Run) -> Run:
        self.outcomes += other.outcomes
        self.stops += other.stops
        return self


def summary(outcomes: Iterable[Outcome]) -> dict[str, Any]:
    """What a handler adds to its answer: one line per thing done to a sweep."""
    return {"sweeps": [{"sweep": o.subject, "result": str(o.result), "trial": o.trial, "detail": o.detail}
                       for o in outcomes]}


def belongs(job_id: str, sweep_id: str) -> bool:
    """Whether job_id is a trial id of that sweep, or a member id of that array (decide.trials.trial_id's shapes)."""
    return re.fullmatch(re.escape(sweep_id) + r"-(t[0-9]{3,}|0|[1-9][0-9]*)", job_id) is not None


def reconcile(ctx: Context, *, now: datetime, jobs: Collection[str] = (), live: Collection[str] | None = None) -> Run:
    """Every sweep with an active-sweeps/ marker (`live`, when the caller has listed them); with `jobs` (the jobs an
    event named), only their sweeps."""
    run = Run()
    for sweep_id in store.live(ctx.registry) if live is None else live:
        if jobs and not any(belongs(job_id, sweep_id) for job_id in jobs):
            continue
        try:
            run += reconcile_one(ctx, sweep_id, now=now)
        except Exception as exc:  # one sweep's trouble (a record that does not parse) is that sweep's only
            log.exception("sweep %s: reconcile failed", sweep_id)
            ctx.metrics.add_metric("SweepErrors", "Count", 1)
            run.outcomes.append(Outcome(sweep_id, Result.ERROR, detail=f"{type(exc).__name__}: {exc}"))
    return run


def reconcile_one(ctx: Context, sweep_id: str, *, now: datetime) -> Run:
    reg = ctx.registry
    record = store.get(reg, sweep_id)[0]
    if record.state == SweepState.CANCELLED:
        if ctx.looking:
            return Run([Outcome(sweep_id, Result.DRY_RUN, "would cancel", t.job_id)
                        for t in record.trials if not t.state])
        return Run(finish_cancel(reg, record, _terminating(ctx), now=now))
    if not record.live:
        if not ctx.looking:
            store.retire(reg, sweep_id)
        return Run()
    if ctx.looking:
        views = trial_views(reg, record, now)
        new = record.advanced(views, decide.plan(record.section, views), now)
        return Run(_would(record, new), _stops(reg, new, {v.job_id: v for v in views}))
    seen: list[decide.TrialView] = []

    def change(current: SweepRecord) -> SweepRecord:
        if not current.live:
            return current
        seen[:] = trial_views(reg, current, now)
        return current.advanced(seen, decide.plan(current.section, seen), now)

    new, wrote = store.update(reg, sweep_id, change)
    if new.state == SweepState.CANCELLED:  # cancelled while this run looked
        return Run(finish_cancel(reg, new, _terminating(ctx), now=now))
    if not new.live:  # ended: by this run's write, or by an overlapping run's (then `seen` is of an older record)
        store.retire(reg, sweep_id)
        return Run([Outcome(sweep_id, Result.ENDED, detail=f"{new.state}: {new.reason}")] if wrote else [])
    read = {v.job_id: v for v in seen}
    return Run(_drops(ctx, new, read, now), _stops(reg, new, read))


def _stops(reg: Registry, record: SweepRecord, views: dict[str, decide.TrialView]) -> list[Action]:
    """The early stops the record names whose trial is still live, as actions on the trial's job as read now: a CAS
    to CANCELLED with the rule's reason, a stop request (its agents checkpoint, sync and stop) and, for a trial that
    has not started, its VMs terminated at once, as a cancel does. A trial that ends meanwhile is skipped."""
    stops = []
    for job_id, reason in sorted(record.stopped.items()):
        view = views.get(job_id)
        if view is None or view.state is None or view.state not in LIVE:
            continue
        try:
            job = reg.job(job_id)
        except (JobNotFound, UnreadableRecord):
            continue
        if job.state in LIVE:
            doomed = tuple(job.instances) if job.state in NOT_STARTED else ()
            stops.append(claim(job, Rule.SWEEP_STOP, reason, Transition(State.CANCELLED),
                               RequestStop(by=records.StopBy.SWEEP), Terminate(doomed)))
    return stops


def _drops(ctx: Context, record: SweepRecord, views: dict[str, decide.TrialView], now: datetime) -> list[Outcome]:
    """Write the drops of the trials this run proposed, and again of any proposed over DROP_GRACE ago that has
    neither a job nor a drop (its proposer died between its write and its drops, or the launcher refused a drop
    someone else wrote under its key: a rejection under its id may be anyone's)."""
    reg, outcomes = ctx.registry, []
    for trial in record.trials:
        view = views.get(trial.job_id)
        if view is not None and view.state is not None:
            continue  # its job exists
        new = view is None  # proposed by this run (the record read before had no such trial)
        if not new and now - trial.proposed_at < DROP_GRACE:
            continue  # its proposer is writing its drop
        key, data = trial_drop(record, trial)
        if not new and (reg.has(key) or reg.exists(trial.job_id)):
            continue  # the drop is there, or the launcher took it (its record is there)
        try:
            reg.put_if_absent(key, data, "application/yaml")
        except PreconditionFailed:
            continue  # an overlapping run wrote it
        if new:
            ctx.metrics.add_metric("SweepTrialsProposed", "Count", 1)
        outcomes.append(Outcome(record.id, Result.PROPOSED if new else Result.DROPPED_AGAIN, _params_text(trial),
                                trial.job_id))
    return outcomes


def _params_text(trial: Trial) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(trial.params.items()))


def trial_drop(record: SweepRecord, trial: Trial) -> tuple[str, bytes]:
    """The trial's queue key (its owner's folder) and the drop's bytes."""
    return (keys.queue_entry(trial.job_id, record.owner),
            yaml.safe_dump(record.trial_doc(trial), sort_keys=False).encode())


def trial_spec(record: SweepRecord, trial: Trial) -> JobSpec:
    """The trial's spec exactly as the launcher reads it from its drop."""
    from jobplane.model import drops  # a drop's owner rules: only a cancelled sweep's trials need them

    key, data = trial_drop(record, trial)
    drop = keys.parse_drop(key)
    assert drop is not None  # queue_entry builds a drop's key
    return drops.read_spec(drop, data)


# ---- reading a sweep's trials ------------------------------------------------------------------------------
def trial_views(reg: Registry, record: SweepRecord, now: datetime) -> list[decide.TrialView]:
    """What the decision sees of each trial: its job's state (None while it has no job record), its objective's
    curve when an early-stop rule compares curves, and, if it SUCCEEDED, its final value. A trial recorded as
    ended is not read again (its curve comes from a cache that no longer changes: jobplane.sweeps.curves). An
    array's members have no objective: their states alone."""
    sweep = record.spec.sweep
    metric = sweep.objective.metric if sweep is not None else ""
    compared = sweep is not None and sweep.early_stop is not None
    views = []
    for trial in record.trials:
        state, job = (trial.state, None) if trial.state is not None else _trial_job(reg, record, trial)
        final = trial.objective
        curve: curves.Curve = ()
        if sweep is not None and state is not None and state != State.INVALID and (
                compared or (state == State.SUCCEEDED and trial.state is None)):
            curve, last = curves.read(reg, record.id, trial.job_id, metric, now, job=job)
            final = last if state == State.SUCCEEDED else None
        views.append(decide.TrialView(trial.number, trial.job_id, trial.params, state, curve if compared else (),
                                      final, job.data if job is not None else None))
    return views


def _trial_job(reg: Registry, record: SweepRecord, trial: Trial) -> tuple[State | None, JobRecord | None]:
    """The trial's job's state and record; None while it has none (its drop is queued, or being written); INVALID
    when no job can be made of it (its spec no longer parses: the launcher would reject its drop), or when the id is
    another job's (never this sweep's trial: not of its owner, or labelled with another sweep or array, or none). A
    rejection under the id says nothing: anyone's forged drop of that id is rejected there too."""
    try:
        job = reg.job(trial.job_id)
    except JobNotFound:
        try:
            trial_spec(record, trial)
        except SpecError:
            return State.INVALID, None
        return None, None
    except UnreadableRecord:
        return None, None  # the job's problem (the sweeper notes it); it still counts as live here
    return (job.state, job) if is_member(record, job) else (State.INVALID, None)


def is_member(record: SweepRecord, job: JobRecord) -> bool:
    """Whether the job is one the control plane made for this sweep or array: of its owner, with its label (the
    launcher records a member's job only from the record: jobplane.decide.members)."""
    return job.owner == record.owner and job.spec.owner == record.owner and job.spec.labels.get(record.label) == \
        record.id


def finish_cancel(reg: Registry, record: SweepRecord, compute: Callable[[], Compute] | None, *,
                  now: datetime, force: bool = False) -> list[Outcome]:
    """A cancelled sweep's trials that have not ended are cancelled as `jobplane cancel` does (one with no job yet
    gets its record first, so its drop, written late by a run that proposed it before the cancel, is never
    launched; VMs of an attempt that had not started are terminated with `compute`); then the marker goes."""
    from jobplane.ops import cancels, jobs  # a cancel: only a cancelled sweep's run does one

    outcomes = []
    for trial in record.trials:
        if trial.state is not None:
            continue
        with contextlib.suppress(JobExists):
            reg.create_job(trial.job_id, trial_spec(record, trial), now)
        try:
            if not is_member(record, reg.job(trial.job_id)):
                continue  # another owner's job under the id: never this sweep's to cancel
            cancels.cancel(reg, trial.job_id, force=force, compute=compute)
        except (jobs.JobError, JobNotFound):
            continue  # it had ended
        outcomes.append(Outcome(record.id, Result.CANCELLED, record.reason, trial.job_id))
    store.retire(reg, record.id)
    return outcomes


def _terminating(ctx: Context) -> Callable[[], Compute] | None:
    return (lambda: ctx.cloud("terminate with")) if ctx.compute is not None else None


def _would(old: SweepRecord, new: SweepRecord) -> list[Outcome]:
    out = [Outcome(old.id, Result.DRY_RUN, f"would propose {_params_text(t)}", t.job_id)
           for t in new.trials[len(old.trials):]]
    if not new.live:
        out.append(Outcome(old.id, Result.DRY_RUN, f"would end {new.state}: {new.reason}"))
    return out
