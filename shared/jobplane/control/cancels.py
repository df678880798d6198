"""A team member's cancel, carried out by the functions: `cancels/<owner>/<id>`.

A team member may write nothing of a job's record (it could rewrite its owner, code or usage) nor its stop request
(it could stop another team's job); IAM lets it write only under its own team's folders, as for its drops
(queue/<owner>/). So `jobplane cancel` by a team member writes a request in its team's cancels/<owner>/, and the
launcher (on the object's event, and its backstop for an event lost) cancels the job as `jobplane cancel` does
(jobplane.ops.cancels.cancel), or the sweep or array with its trials, only when its owner is the folder's: the folder
is who asked, never what the request says. The request is deleted once carried out or refused; a refusal is logged
with both owners.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from enum import StrEnum

from jobplane.clouds.base import NotFound
from jobplane.deployment.context import Context
from jobplane.deployment.outcome import Outcome
from jobplane.model import keys
from jobplane.store.registry import JobNotFound

log = logging.getLogger("jobplane.cancels")

MAX_REQUEST = 4096  # bytes of a request read: it says only whether to force


class Result(StrEnum):
    CANCELLED = "cancelled"
    ENDED = "ended"  # the job had ended (or its queued spec will be rejected): nothing to cancel
    REFUSED = "refused"  # the job is another owner's
    MISSING = "missing"  # no such job, sweep or array
    GONE = "gone"  # the request was carried out already
    IGNORED = "ignored"  # not a cancel request


def handle(ctx: Context, key: str, *, now: datetime) -> Outcome:
    """Carry out the cancel request at `key` (registry-relative); say what became of it."""
    from jobplane.ops import cancels, jobs  # the cancel itself: only a run that found a request needs it

    parsed = keys.parse_cancel_request(key)
    if parsed is None:
        return Outcome(key, Result.IGNORED)
    owner, job_id = parsed
    reg = ctx.registry
    try:
        request = json.loads(reg.get_bytes(key)[:MAX_REQUEST])
    except NotFound:
        return Outcome(key, Result.GONE)
    except ValueError:
        request = {}  # still a request to cancel: only whether to force is unreadable
    force = isinstance(request, dict) and request.get("force") is True
    try:
        view = jobs.find(reg, job_id)
    except JobNotFound:
        return _sweep(ctx, key, owner, job_id, force=force, now=now)
    if view.owner != owner:
        return _refused(ctx, key, job_id, view.owner, owner)
    if ctx.dry_run:
        return Outcome(job_id, Result.CANCELLED, f"would cancel it, asked by {owner}")
    try:
        done = cancels.cancel(reg, job_id, force=force, compute=lambda: ctx.cloud("terminate with"), by=owner)
    except jobs.JobError as exc:
        return _done(ctx, key, Outcome(job_id, Result.ENDED, str(exc)))
    terminated = f"; terminated {', '.join(done.terminated)}" if done.terminated else ""
    return _done(ctx, key, Outcome(job_id, Result.CANCELLED, f"cancelled, asked by {owner}{terminated}"))


def _sweep(ctx: Context, key: str, owner: str, sweep_id: str, *, force: bool, now: datetime) -> Outcome:
    """A request naming no job: a sweep's or an array's id, cancelled as `jobplane cancel <array>` does."""
    from jobplane.sweeps import ops, store  # only a request naming a sweep needs them

    try:
        record = store.get(ctx.registry, sweep_id)[0]
    except store.SweepNotFound:
        return _done(ctx, key, Outcome(sweep_id, Result.MISSING, f"no job or sweep {sweep_id} to cancel"))
    if record.owner != owner:
        return _refused(ctx, key, sweep_id, record.owner, owner)
    if ctx.dry_run:
        return Outcome(sweep_id, Result.CANCELLED, f"would cancel it, asked by {owner}")
    compute = (lambda: ctx.cloud("terminate with")) if ctx.compute is not None else None
    try:
        ops.cancel(ctx.registry, sweep_id, compute, now, force=force, by=owner)
    except ops.SweepEnded as exc:
        return _done(ctx, key, Outcome(sweep_id, Result.ENDED, str(exc)))
    return _done(ctx, key, Outcome(sweep_id, Result.CANCELLED, f"cancelled with its trials, asked by {owner}"))


def _refused(ctx: Context, key: str, subject: str, whose: str, owner: str) -> Outcome:
    why = f"{subject} is {whose}'s, not {owner}'s: a team cancels only its own jobs"
    log.warning("cancel refused: %s", why, extra={"job_id": subject, "owner": owner})
    ctx.metrics.add_metric("CancelsRefused", "Count", 1)
    return _done(ctx, key, Outcome(subject, Result.REFUSED, why))


def _done(ctx: Context, key: str, outcome: Outcome) -> Outcome:
    if not ctx.dry_run:
        ctx.registry.delete(key)
    return outcome


def requests(ctx: Context) -> list[str]:
    """The cancel requests waiting (the backstop carries out any whose event was lost)."""
    return [key for key, _, _ in ctx.registry.listing(keys.CANCELS) if keys.parse_cancel_request(key)]
