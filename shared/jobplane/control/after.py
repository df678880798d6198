"""A job's `after:` gated before its admission (jobplane.decide.dependencies decides): the launcher's claimed attempt
goes on, waits for its dependencies (marked under after/<dependency>/, so the run that ends one moves it on:
jobplane.control.launcher.release_dependents), or fails naming the one that ended otherwise. A dependency whose
record does not parse is waited for, saying so, within the job's max_wait.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.control import steps
from jobplane.decide import dependencies
from jobplane.decide.rules import LaunchCause
from jobplane.deployment.context import Context
from jobplane.model import keys
from jobplane.store.registry import JobNotFound, UnreadableRecord

if TYPE_CHECKING:  # the registry builds it when it reads or writes one
    from jobplane.model.jobrecord import JobRecord


def gate(ctx: Context, record: JobRecord, now: datetime) -> JobRecord | None:
    """The gate of a job's `after:` (jobplane.decide.dependencies): None once every dependency SUCCEEDED; else the
    record waiting for them (marked under after/<dependency>/ first, then read again, so a dependency that ends
    meanwhile is seen either here or by the run that ends it), or FAILED naming the first that ended otherwise."""
    from jobplane.decide import launch as launch_decide  # only a run that launches decides a launch

    reg = ctx.registry

    def read() -> dependencies.Waiting | dependencies.Failed | None:
        found = []
        for dep in record.spec.after:
            try:
                other = reg.job(dep)
                found.append(dependencies.Dependency(dep, other.state, other.reason))
            except JobNotFound:
                found.append(dependencies.Dependency(dep, None))
            except UnreadableRecord:  # its job.json does not parse: the wait says so, and max_wait bounds it
                found.append(dependencies.Dependency(dep, None, unreadable=True))
        return dependencies.gate(found)

    step = read()
    if isinstance(step, dependencies.Waiting):
        for dep in step.on:
            reg.put(keys.waiting_for(dep, record.id), b"", "text/plain")
        step = read()
    if step is None:
        return None
    if isinstance(step, dependencies.Failed):
        return steps.fail(ctx, record, now, launch_decide.Fail(step.reason, LaunchCause.DEPENDENCY_FAILED))
    wait = launch_decide.backoff(record, ctx.policy, now, reason=step.reason, error=step.reason,
                                 cause=LaunchCause.AFTER)
    return steps.wait(reg, record, wait, now) if isinstance(wait, launch_decide.Wait) else \
        steps.fail(ctx, record, now, wait)
