"""Launcher: queue/ drops become job records, and attempts become VMs (docs/architecture.md).

Idempotency rests on the registry, not on the cloud: job.json is created create-only, and every attempt
is claimed by a CAS transition to LAUNCHING before any VM is asked for, so redelivered events, the cron
backstop and overlapping reruns never launch one attempt twice.

Order for a drop: create the record, launch, then delete the queue entry. If a run dies in between, the
entry is still there and the backstop finishes the job (the record exists, the claim decides who launches).
A cancel that lands after the claim is seen by a re-read before each RunInstances, or by the refused
transition that records the VMs, which then terminates them at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from jobplane.clouds.base import (
    CapacityError,
    Compute,
    LaunchRejected,
    LaunchRequest,
    NotFound,
)
from jobplane.control import steps
from jobplane.decide.rules import Cause, LaunchCause, Rule
from jobplane.deployment.context import Context
from jobplane.deployment.outcome import Outcome as Outcome  # the one outcome type, named here too
from jobplane.model import keys
from jobplane.model.errors import FieldError, SpecError
from jobplane.model.policy import check_against_deployment, check_against_policy
from jobplane.model.states import TERMINAL, State
from jobplane.store.registry import JobExists, JobNotFound, Registry, TransitionRefused

if TYPE_CHECKING:  # imported where a launch uses them: a cold start, or a cron run with nothing to launch, never does
    from jobplane.model.admission import AdmissionRecord, Reservation
    from jobplane.model.jobrecord import JobRecord  # the registry builds it when it reads or writes one
    from jobplane.model.spec import JobSpec

log = logging.getLogger("jobplane.launcher")


class Result(StrEnum):
    """What the launcher did with a queue entry or a capacity wait (the wire value is the string)."""

    LAUNCHED = "launched"
    WAITING = "waiting"  # for capacity or the owner's quota; the backstop retries
    FAILED = "failed"
    MOVED_ON = "moved-on"  # cancelled (or moved on) while it launched: no VM is kept
    REJECTED = "rejected"  # unreadable spec, a bad name, or an owner that is not the drop's (jobplane.model.drops)
    INVALID = "invalid"  # breaks the policy: recorded as an INVALID job
    DUPLICATE = "duplicate"  # the id belongs to another job
    EXISTS = "exists"  # handled already (another delivery of the drop claimed it)
    CLAIMED = "claimed"  # a capacity wait another run retried first
    GONE = "gone"  # the entry was consumed already
    IGNORED = "ignored"  # not a queue entry
    SWEEP = "sweep"  # a sweep's spec: the sweep recorded, its first trials dropped
    ARRAY = "array"  # an array's spec: recorded as a sweep is, its first members dropped
    ERROR = "error"  # the backstop caught an exception and went on with the others
    NOT_DUE = "not-due"  # a capacity wait whose time has not come (not reported)


_BY_STATE = {State.LAUNCHING: Result.LAUNCHED, State.WAITING_CAPACITY: Result.WAITING, State.FAILED: Result.FAILED}


def _of(subject: str, record: JobRecord) -> Outcome:
    result = _BY_STATE.get(record.state, Result.MOVED_ON)
    return Outcome(subject, result, record.reason if result != Result.MOVED_ON else f"now {record.state}")


def summary(results: Iterable[Outcome]) -> dict[str, Any]:
    """What a handler returns: one line per queue entry or waiting job."""
    return {"outcomes": [{"subject": r.subject, "result": str(r.result), "detail": r.detail} for r in results]}


# ---- drops -----------------------------------------------------------------------------------------------
def handle_drop(ctx: Context, key: str, *, now: datetime) -> Outcome:
    """Turn one queue/ object (key relative to the registry root) into a job; say what happened."""
    reg = ctx.registry
    drop = keys.parse_drop(key)
    if drop is None:
        return Outcome(key, Result.IGNORED)
    job_id = drop.job_id
    try:
        data = reg.get_bytes(key)
    except NotFound:
        return Outcome(key, Result.GONE)
    from jobplane.model import drops  # a drop's spec (yaml_input, the owner rules): only a queue entry needs it

    try:
        found = _membership(reg, job_id, drops.read_spec(drop, data))
    except SpecError as exc:
        return _reject(ctx, key, job_id, data, exc.errors, now)
    if isinstance(found, list):
        return _reject(ctx, key, job_id, data, found, now)
    spec = found  # a member's: its sweep's record made it
    compute = ctx.cloud("launch with")
    problems = (check_against_policy(spec, ctx.policy) + check_against_deployment(spec, compute.cloud, compute.region)
                + _code_problems(spec, reg, None if spec.fan_out is not None else job_id)
                + _dependency_problems(spec, reg, job_id))
    if spec.fan_out is not None:
        return _sweep(ctx, key, job_id, data, spec, problems, now)
    try:
        reg.create_job(job_id, spec, now)
    except JobExists:
        existing = reg.job(job_id)
        if existing.spec != spec:
            return _reject(ctx, key, job_id, data, [FieldError("id", f"job {job_id!r} already exists "
                           f"(state {existing.state}); job ids are never reused: pick another id")],
                           now, result=Result.DUPLICATE)
        # the same spec again: a redelivered event (or an identical re-drop); the record decides the rest
    if problems:
        return _invalid(ctx, key, job_id, data, problems, now)
    try:
        outcome = _of(key, launch_attempt(ctx, job_id, now=now, expect={State.QUEUED}, expect_attempt=0,
                                          reason="launching attempt 1", cause=LaunchCause.SUBMITTED))
    except TransitionRefused as exc:
        outcome = Outcome(key, Result.EXISTS, str(exc))  # another delivery of this drop claimed it first
        reg.repair_markers(job_id)  # that delivery may have died before its marker: the check must see the job
    reg.delete(key)
    return outcome


def _membership(reg: Registry, job_id: str, spec: JobSpec) -> JobSpec | list[FieldError]:
    """The spec to record, or why the drop may not be a job of a sweep or an array (jobplane.decide.members): the
    record of the sweep or array its id names, one GET, read only for an id of a member's shape."""
    from jobplane.decide import members, trials

    named = trials.parent_of(job_id)
    if named is None:
        return members.admit(spec, job_id, None)
    from jobplane.sweeps import run, store  # only an id of a member's shape needs its sweep's record

    sweep_id, array = named
    try:
        record = store.get(reg, sweep_id)[0]
    except store.SweepNotFound:
        return members.admit(spec, job_id, None)
    except store.UnreadableSweep:  # nothing can vouch for a member of it, nor say which ids it will make
        return members.admit(spec, job_id, members.Parent(sweep_id, array))
    if record.is_array != array:
        return members.admit(spec, job_id, None)  # run-2 is no member id of a sweep run, nor run-t002 of an array
    trial, member = record.trial(job_id), None
    if trial is not None and members.claims(spec):
        with contextlib.suppress(SpecError):  # a record whose member no longer parses vouches for no drop
            member = run.trial_spec(record, trial)
    return members.admit(spec, job_id, members.Parent(sweep_id, array, record.owner, member))


def _code_problems(spec: JobSpec, reg: Registry, job_id: str | None) -> list[FieldError]:
    """A `code:` in the registry's bucket is the job's own bundle, the one object its credentials will read
    (decide.vend.code_object), or the spec is refused naming `code`. job_id None: a sweep's (or array's) spec."""
    from jobplane.decide import vend

    data = keys.JobData(job_id, spec.owner) if job_id else None  # where the record made of it keeps its data
    found = vend.code_object(spec.code, bucket=reg.bucket or "", root=reg.root, owner=spec.owner, data=data)
    return [FieldError("code", found.why)] if isinstance(found, vend.Refusal) else []


def _dependency_problems(spec: JobSpec, reg: Registry, job_id: str) -> list[FieldError]:
    """Each job or array `after:` names must exist when this one is submitted (a HEAD or two each): jobplane.ops.
    admissible, which submit runs too."""
    from jobplane.ops import admissible

    return admissible.dependency_problems(reg, spec, job_id)


def _sweep(ctx: Context, key: str, sweep_id: str, data: bytes, spec: JobSpec, problems: list[FieldError],
           now: datetime) -> Outcome:
    """A spec with a `sweep:` section: record the sweep (create-only) and run its reconcile once, which drops its
    first trials; a spec the policy refuses is rejected as a job's would be (no record: a sweep is not a job). An
    `array:` section is recorded and run the same way: its trials are its members."""
    from jobplane.sweeps import record, run, store  # only a sweep's drop needs them

    reg = ctx.registry
    if problems:
        return _reject(ctx, key, sweep_id, data, problems, now, result=Result.INVALID)
    try:
        if reg.exists(sweep_id):
            raise store.SweepExists(sweep_id)
        store.create(reg, record.SweepRecord.new(sweep_id, spec, now))
    except store.SweepExists:
        return _reject(ctx, key, sweep_id, data, [FieldError("id", f"{sweep_id!r} is already a job's or another "
                       "sweep's id; ids are never reused: pick another id")], now, result=Result.DUPLICATE)
    outcomes = run.reconcile_one(ctx, sweep_id, now=now).outcomes  # a new sweep has no trial to stop
    reg.delete(key)
    proposed = ", ".join(str(o.trial) for o in outcomes if o.result == run.Result.PROPOSED)
    if spec.sweep is None:
        return Outcome(key, Result.ARRAY, f"array {sweep_id} recorded; members dropped: {proposed}")
    return Outcome(key, Result.SWEEP, f"sweep {sweep_id} recorded; trials dropped: {proposed}")


def _write_rejection(reg: Registry, key: str, job_id: str, data: bytes, errors: list[FieldError],
                     now: datetime) -> None:
    reg.put(keys.rejected_spec(job_id), data, "application/yaml")
    reg.put_json(keys.rejected_error(job_id), {"errors": [e.as_dict() for e in errors], "time": now.isoformat(),
                                               "source_key": key})
    log.warning("rejected %s: %s", key, "; ".join(map(str, errors)), extra={"job_id": job_id})


def _reject(ctx: Context, key: str, job_id: str, data: bytes, errors: list[FieldError], now: datetime,
            result: Result = Result.REJECTED) -> Outcome:
    """Keep the drop and its reasons under rejected/, then consume it. Nothing is launched."""
    _write_rejection(ctx.registry, key, job_id, data, errors, now)
    ctx.registry.delete(key)
    ctx.metrics.add_metric("JobsRejected", "Count", 1)
    return Outcome(key, result, "; ".join(map(str, errors)))


def _invalid(ctx: Context, key: str, job_id: str, data: bytes, errors: list[FieldError], now: datetime) -> Outcome:
    """A well-formed spec the policy refuses: rejected/ as above, and the job recorded as INVALID."""
    from jobplane.model import history  # the events: with the record's models, which a run loads when it reads one

    reg = ctx.registry
    _write_rejection(reg, key, job_id, data, errors, now)
    try:
        reg.transition(job_id, State.INVALID, now=now, expect={State.QUEUED}, expect_attempt=0,
                       reason="; ".join(map(str, errors)), cause=LaunchCause.INVALID,
                       event=history.Rejected(errors=[e.as_dict() for e in errors]))
        ctx.metrics.add_metric("JobsRejected", "Count", 1)
    except TransitionRefused:
        pass  # another delivery recorded it
    reg.delete(key)
    return Outcome(key, Result.INVALID, "; ".join(map(str, errors)))


# ---- the cron backstop -----------------------------------------------------------------------------------
def backstop(ctx: Context, *, now: datetime, min_age: int = 60, budget: float | None = None) -> list[Outcome]:
    """Catch what events missed: queue entries older than min_age s, and capacity waits that are over.

    budget: seconds this run may spend (its function's remaining time less a launch's worth): no new item is
    started after it, so the run ends on its own and the next cron run goes on where it stopped."""
    reg = ctx.registry
    outcomes: list[Outcome] = []
    deadline = None if budget is None else time.monotonic() + budget

    def out_of_time() -> bool:
        if deadline is None or time.monotonic() < deadline:
            return False
        log.warning("backstop: time budget spent, %d items done; the next run goes on", len(outcomes))
        ctx.metrics.add_metric("BackstopBudgetSpent", "Count", 1)
        return True

    from jobplane.control import admission  # the backstop admits in order first: a slot no run passed on waits for it

    try:
        lines = admission.owners(reg)
    except Exception:  # an unreadable admission record: its owner's jobs are retried one by one below
        log.exception("backstop: reading the admission records failed")
        lines = []
    launched, in_line = admit_in_order(ctx, lines, now), admission.in_line(lines, now)
    outcomes += [Outcome(job_id, Result.LAUNCHED, "a slot of the quota freed: admitted in order")
                 for job_id in launched]
    from jobplane.control import cancels  # a team member's cancel request whose event was lost: before any drop

    for key in cancels.requests(ctx):
        outcomes.append(_guarded(key, cancels.handle, ctx, key, now=now))
    for key, modified, _ in list(reg.listing(keys.QUEUE)):
        if out_of_time():
            return outcomes
        if now - modified >= timedelta(seconds=min_age):
            outcomes.append(_guarded(key, handle_drop, ctx, key, now=now))
    for job_id, markers in reg.active().items():
        if [m.state for m in markers] != [State.WAITING_CAPACITY] or job_id in in_line:
            continue  # not waiting (or markers need a repair, which the check does), or in an owner's line
        if out_of_time():
            return outcomes
        outcome = _guarded(job_id, _retry_waiting, ctx, job_id, now=now)
        if outcome.result != Result.NOT_DUE:
            outcomes.append(outcome)
    return outcomes


def admit_in_order(ctx: Context, lines: list[AdmissionRecord], now: datetime) -> list[str]:
    """Launch, in order, the waiting jobs each owner's free nodes admit (its admission record, as read): what a run
    that freed a slot does at once, rather than leave it to the jobs' backoff. Each launch claims the job (one run
    launches it) and admits it again. The jobs launched."""
    from jobplane.control import admission  # only a run that frees or looks for free nodes admits in order

    launched: list[str] = []
    freed = False
    for waiter in admission.in_order(ctx.registry, lines, ctx.policy, now):
        try:
            after = launch_attempt(ctx, waiter.job_id, now=now, expect={State.WAITING_CAPACITY},
                                   expect_attempt=waiter.attempt, cause=LaunchCause.WAIT_OVER,
                                   reason="a slot of the quota freed: admitted in order", pass_on=False)
        except TransitionRefused:
            continue  # another run launched it, or it moved on (the reclaim drops its wait)
        except Exception:  # this job's launch only: the backstop retries it, the others go on
            log.exception("admitting %s in order failed", waiter.job_id, extra={"job_id": waiter.job_id})
            continue
        if after.state == State.LAUNCHING:
            launched.append(waiter.job_id)
        freed |= after.state in TERMINAL  # cancelled while it launched, or its launch failed: its slot is free again
    if freed:  # the next in line takes it now, not at the next check or backstop (each pass ends one job at least)
        launched += admit_in_order(ctx, admission.owners(ctx.registry), now)
    return launched


def _retry_waiting(ctx: Context, job_id: str, *, now: datetime) -> Outcome:
    record = ctx.registry.job(job_id)  # a GET only for waiting jobs; one that does not parse is this job's error only
    if record.state != State.WAITING_CAPACITY:
        # its marker says waiting, its record moved on: a claim whose marker move failed (a store error, a crash)
        # would be no run's to look at (the check leaves waiting markers to this backstop); its marker follows now
        ctx.registry.repair_markers(job_id)
        return Outcome(job_id, Result.NOT_DUE)
    if record.wait_until and record.wait_until > now:
        return Outcome(job_id, Result.NOT_DUE)
    attempt = record.attempt
    try:
        return _of(job_id, launch_attempt(ctx, job_id, now=now, expect={State.WAITING_CAPACITY},
                                          expect_attempt=attempt, reason="capacity wait over: retrying",
                                          cause=LaunchCause.WAIT_OVER))
    except TransitionRefused as exc:
        return Outcome(job_id, Result.CLAIMED, str(exc))


def _guarded(subject: str, fn: Callable[..., Outcome], *args: Any, **kwargs: Any) -> Outcome:
    """One bad job must not stop the backstop from serving the others."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        log.exception("backstop failed on %s", subject, extra={"job_id": subject})
        return Outcome(subject, Result.ERROR, f"{type(exc).__name__}: {exc}")


# ---- one attempt -----------------------------------------------------------------------------------------
def launch_attempt(ctx: Context, job_id: str, *, now: datetime, expect: Collection[State], expect_attempt: int,
                   cause: Cause, reason: str | None = None, retry: bool = False, pass_on: bool = True) -> JobRecord:
    """Claim the job (CAS to LAUNCHING), then launch it, wait for capacity, or fail it: snapshot, then
    jobplane.decide.launch one step at a time, each step applied here. `cause`: what asks for the attempt (a new
    drop, a wait that is over, a reconciler's rule). `retry`: the check retries an error (the spec's retry:),
    counted in the record's retries instead of its restarts. `pass_on`: when the deployment's order makes it wait
    behind jobs that have nodes free now, launch those (the in-order admission, which launches them itself, says
    no)."""
    from jobplane.decide import launch as launch_decide  # only a run that launches decides a launch
    from jobplane.model import history  # the events: with the record's models, which a run loads when it reads one

    reg, compute = ctx.registry, ctx.cloud("launch with")
    current = reg.job(job_id)
    claimed = launch_decide.claim(current, expect=expect, expect_attempt=expect_attempt, reason=reason, retry=retry)
    if isinstance(claimed, launch_decide.Refused):
        raise TransitionRefused(job_id, current.state, State.LAUNCHING, claimed.why)
    record = reg.transition(job_id, State.LAUNCHING, now=now, reason=claimed.reason, cause=cause,
                            expect={current.state}, expect_attempt=current.attempt, attempt=claimed.attempt,
                            restarts=claimed.restarts, retries=claimed.retries, instances=[], instance_type=None,
                            zone=None, launched_at=None,
                            event=history.Retried(retries=claimed.retries) if claimed.retries != current.retries
                            else None)
    return _launch(ctx, compute, record, now=now, pass_on=pass_on)


def resume(ctx: Context, job_id: str, *, attempt: int, stamp: str, now: datetime) -> JobRecord:
    """Finish the launch of a claimed attempt whose launcher died (the check's RESUME_LAUNCH, from the record
    whose event stamp is `stamp`): adopt the attempt's VMs if RunInstances ran (those its cluster.json names, live
    or ended since; else those the cloud lists by their tags: record them, write their cluster.json; harmless
    twice), else claim the record again by its stamp (one of overlapping runs wins) and
    launch them. Same attempt, no restart counted; a resume that dies too is resumed by a later check."""
    reg, compute, policy = ctx.registry, ctx.cloud("launch with"), ctx.policy
    record = reg.job(job_id)
    if record.state != State.LAUNCHING or record.attempt != attempt or record.instances \
            or record.last_event is None or record.last_event.stamp != stamp:
        return record  # moved on meanwhile
    listed = [i for i in compute.list_managed() if i.job_id == job_id and i.attempt == attempt]
    found = sorted((i for i in listed if i.state in ("pending", "running")), key=lambda i: (i.rank or 0, i.id))
    spec = record.spec
    if (named := steps.named(reg, record, listed)) is not None:  # launched and told so: never launched again
        found = named
    if found and len(found) == spec.num_nodes:
        first = found[0]
        request = LaunchRequest(job_id=job_id, attempt=attempt, num_nodes=len(found),
                                instance_type=first.instance_type or "", zone=first.zone, image="(adopted)",
                                spot=first.spot, user_data="", max_runtime=policy.vm_lifetime(spec),
                                disk_gb=spec.disk_gb, owner=record.owner)
        log.warning("job %s attempt %d: adopting %s launched before the launcher stopped", job_id, attempt,
                    [i.id for i in found], extra={"job_id": job_id})
        return steps.launched(ctx, compute, record, request, [(i.id, i.private_ip, i.zone) for i in found], now, [],
                              steps.attempt_usage(compute, request, found, policy, now))
    if found:  # part of an all-or-nothing launch: not a cluster
        compute.terminate([i.id for i in found])
    record = reg.transition(job_id, State.LAUNCHING, now=now, expect={State.LAUNCHING}, expect_attempt=attempt,
                            expect_event=stamp, cause=Rule.RESUME_LAUNCH, state_since=now,
                            reason=f"resuming the launch of attempt {attempt}: its launcher stopped before it recorded "
                                   "any VM")
    return _launch(ctx, compute, record, now=now)


def _launch(ctx: Context, compute: Compute, record: JobRecord, *, now: datetime, pass_on: bool = True) -> JobRecord:
    """Launch a claimed attempt: snapshot, then jobplane.decide.launch one step at a time."""
    from jobplane.control import admission  # only a run that launches admits
    from jobplane.control import after as dependencies  # only a run that launches gates a job's after:
    from jobplane.decide import launch as launch_decide  # only a run that launches decides a launch

    reg, job_id = ctx.registry, record.id
    if record.spec.after and (held := dependencies.gate(ctx, record, now)) is not None:
        return held  # waiting for a dependency (or failed by one): no quota held
    over = admission.admit(reg, record, ctx.policy, now)  # its reservation, by compare-and-swap, before any VM
    if over is not None and over.never:  # the policy in force can never admit it: waiting would only hold its line
        return steps.fail(ctx, record, now, launch_decide.Fail(over.reason, LaunchCause.NEVER_FITS))
    snap = steps.snapshot(reg, record, ctx.policy, over_quota=over.reason if over and not over.budget else None,
                          over_budget=over.reason if over and over.budget else None)
    scripts: dict[str, str] = {}  # per CPU architecture: each fetches its own agent bundle
    while isinstance(planned := steps.next_step(reg, compute, snap, now, scripts), tuple):
        step, request = planned
        current = reg.job(job_id)  # cancelled since the claim? then no VM is asked for
        if current.state != State.LAUNCHING or current.attempt != record.attempt:
            log.info("job %s moved on to %s before launch", job_id, current.state, extra={"job_id": job_id})
            admission.release(reg, record)  # the cancel's own release may have come before our admission
            return current
        try:
            instances = compute.launch(request)
        except CapacityError as exc:
            ctx.metrics.add_metric("LaunchCapacityErrors", "Count", 1)
            log.info("no capacity for %s in %s: %s", step.instance_type, step.zone or "any zone", exc,
                     extra={"job_id": job_id})
            snap = snap.after(launch_decide.Tried(step.instance_type, step.zone, str(exc), spot=step.spot))
            continue
        except LaunchRejected as exc:
            snap = snap.after(launch_decide.Tried(step.instance_type, step.zone, str(exc), rejected=True,
                                                  spot=step.spot))
            continue
        return steps.launched(ctx, compute, record, request, [(i.id, i.private_ip, i.zone) for i in instances],
                              now, [f"{t.where}: {t.error}" for t in snap.tried],
                              steps.attempt_usage(compute, request, instances, ctx.policy, now), fallback=step.fallback)
    done = steps.wait(reg, record, planned, now) if isinstance(planned, launch_decide.Wait) else \
        steps.fail(ctx, record, now, planned)
    if over is not None and over.ahead and pass_on:
        _pass_on(ctx, over.ahead, now)
    return done


def _pass_on(ctx: Context, ahead: Iterable[Reservation], now: datetime) -> None:
    """Launch the jobs the deployment's order admits before this one: they wait in its record with nodes free for
    them now, and would otherwise wait for the next in-order admission (a check, the backstop)."""
    for waiter in ahead:
        try:
            launch_attempt(ctx, waiter.job_id, now=now, expect={State.WAITING_CAPACITY}, expect_attempt=waiter.attempt,
                           cause=LaunchCause.WAIT_OVER, reason="first in the deployment's order", pass_on=False)
        except TransitionRefused:
            continue  # another run launched it, or it moved on
        except Exception:  # this run's own job is recorded; the scheduled pass admits them
            log.exception("launching %s, first in the deployment's order, failed", waiter.job_id,
                          extra={"job_id": waiter.job_id})


def release_dependents(ctx: Context, ended: Collection[str], now: datetime) -> list[str]:
    """The jobs waiting for these (now ended) go on at once: each one's gate is run again through the launcher's
    claim, which launches it, lets it wait for its other dependencies, or fails it; a job that fails so releases
    its own dependents in turn. One listing of after/<job>/ per ended job. The jobs moved on."""
    reg, moved = ctx.registry, []
    todo = list(ended)
    while todo:
        dependency = todo.pop(0)
        for key, _, _ in list(reg.listing(keys.waiting_for(dependency))):
            job_id = key.rsplit("/", 1)[-1]
            try:
                waiting = reg.job(job_id)
                if waiting.state == State.WAITING_CAPACITY and waiting.cause == LaunchCause.AFTER:
                    after = launch_attempt(ctx, job_id, now=now, expect={State.WAITING_CAPACITY},
                                           expect_attempt=waiting.attempt, cause=LaunchCause.WAIT_OVER,
                                           reason=f"dependency {dependency} ended: going on")
                    moved.append(job_id)
                    if after.state in TERMINAL:
                        todo.append(job_id)
            except (TransitionRefused, JobNotFound):
                pass  # another run moved it on, or it is gone
            except Exception:  # this job only: its backoff's retry gates it again
                log.exception("releasing %s after %s failed", job_id, dependency, extra={"job_id": job_id})
                continue
            reg.delete(key)
    return moved
