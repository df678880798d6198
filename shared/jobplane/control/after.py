"""A job's `after:` gated before its admission (jobplane.decide.dependencies decides): the launcher's claimed attempt
goes on, waits for its dependencies (marked under after/<dependency>/, so the run that ends one moves it on:
jobplane.control.launcher.release_dependents), or fails naming the one that can no longer be met. Each entry names a
job (its job.json, a GET) or an array or sweep (sweeps/<id>/sweep.json, which says when it ended and how). A
dependency whose record does not parse is waited for, saying so, within the job's max_wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.control import steps
from jobplane.decide import dependencies
from jobplane.decide.dependencies import Dependency, entries
from jobplane.decide.rules import LaunchCause
from jobplane.deployment.context import Context
from jobplane.model import keys
from jobplane.store.registry import JobNotFound, Registry, UnreadableRecord

if TYPE_CHECKING:  # the registry builds it when it reads or writes one
    from jobplane.model.jobrecord import JobRecord


def read(reg: Registry, after: Sequence[str]) -> list[Dependency]:
    """Each entry of `after:` as it stands now: a job's record, else an array's (or a sweep's), else nothing of that
    id; a record that does not parse says so (unreadable)."""
    from jobplane.sweeps import store  # only a job waiting for another reads a dependency

    found = []
    for entry in entries(after):
        try:
            job = reg.job(entry.target)
            found.append(Dependency(entry.target, job.state, job.reason, entry.kind))
            continue
        except JobNotFound:
            pass
        except UnreadableRecord:  # its job.json does not parse: the wait says so, and max_wait bounds it
            found.append(Dependency(entry.target, None, kind=entry.kind, unreadable=True))
            continue
        try:
            record = store.get(reg, entry.target)[0]
        except store.SweepNotFound:
            found.append(Dependency(entry.target, None, kind=entry.kind))
            continue
        except store.UnreadableSweep:
            found.append(Dependency(entry.target, None, kind=entry.kind, array=True, unreadable=True))
            continue
        found.append(Dependency(entry.target, record.state, record.reason, entry.kind, array=True))
    return found


def gate(ctx: Context, record: JobRecord, now: datetime) -> JobRecord | None:
    """The gate of a job's `after:` (jobplane.decide.dependencies): None once every dependency is met; else the
    record waiting for them (marked under after/<dependency>/ first, then read again, so a dependency that ends
    meanwhile is seen either here or by the run that ends it), or FAILED naming the first that can no longer be met."""
    from jobplane.decide import launch as launch_decide  # only a run that launches decides a launch

    reg = ctx.registry
    step = dependencies.gate(read(reg, record.spec.after))
    if isinstance(step, dependencies.Waiting):
        for dep in step.on:
            reg.put(keys.waiting_for(dep, record.id), b"", "text/plain")
        step = dependencies.gate(read(reg, record.spec.after))
    if step is None:
        return None
    if isinstance(step, dependencies.Failed):
        return steps.fail(ctx, record, now, launch_decide.Fail(step.reason, LaunchCause.DEPENDENCY_FAILED))
    wait = launch_decide.backoff(record, ctx.policy, now, reason=step.reason, error=step.reason,
                                 cause=LaunchCause.AFTER)
    return steps.wait(reg, record, wait, now) if isinstance(wait, launch_decide.Wait) else \
        steps.fail(ctx, record, now, wait)
