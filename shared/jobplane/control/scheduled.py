"""The scheduled pass: what the sweeper function runs on its schedule and for an event (an exit report, a VM's
state change), on both clouds and in the day tests alike. First the check of every live job and managed VM
(reconcile.check); then the sweeps' reconcile (jobplane.sweeps.run), so a trial the check saw end is replaced in the
same run, and the jobs waiting for an array it ended go on (their `after:`); then the sweeps' early stops, applied as
the check's actions are: the blast-radius limit, dry-run, the stop's events and metric. The sweeps' engine (and their
specs' models) loads in a run that finds a live sweep."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobplane.control import reconcile
from jobplane.decide.safety import limit_blast_radius
from jobplane.deployment.context import Context
from jobplane.deployment.outcome import Outcome
from jobplane.sweeps import store as sweep_store

log = logging.getLogger("jobplane.scheduled")


@dataclass(frozen=True)
class Pass:
    """What one pass did: to jobs and VMs (the check's actions, then the sweeps' early stops), and to sweeps."""

    checked: list[Outcome]
    swept: list[Outcome]


def run(ctx: Context, *, now: datetime, force: bool = False, jobs: Collection[str] = (),
        instance_ids: Collection[str] = ()) -> Pass:
    """One pass. `jobs` / `instance_ids` (from an event) are looked at closely by the check, and only the sweeps
    whose trials `jobs` names are reconciled; `force` lifts the blast-radius limit and the graces."""
    checked = reconcile.check(ctx, now=now, force=force, jobs=jobs, instance_ids=instance_ids)
    live = sweep_store.live(ctx.registry)
    if not live:
        return Pass(checked, [])
    from jobplane.sweeps import run as sweeps

    swept = sweeps.reconcile(ctx, now=now, jobs=jobs, live=live)
    _release(ctx, [o.subject for o in swept.outcomes if o.result == sweeps.Result.ENDED], now)
    if swept.stops:
        fleet = ctx.compute.list_managed() if ctx.compute is not None else []
        checked += reconcile.apply(ctx, limit_blast_radius(swept.stops, fleet, ctx.policy, force=force), now=now)
    return Pass(checked, swept.outcomes)


def _release(ctx: Context, ended: list[str], now: datetime) -> None:
    """The jobs waiting for the arrays (or sweeps) this pass ended go on at once (their `after:`), as the check's
    runs release the jobs waiting for the jobs they end."""
    if not ended or ctx.looking:
        return
    from jobplane.control import launcher

    try:
        launcher.release_dependents(ctx, ended, now)
    except Exception:  # they go on at their backoff's retry
        log.exception("releasing the jobs waiting for %s failed", ended)


def summary(done: Pass) -> dict[str, Any]:
    """What the function answers: one line per action, then one per thing done to a sweep (if any)."""
    if not done.swept:
        return reconcile.summary(done.checked)
    from jobplane.sweeps import run as sweeps

    return {**reconcile.summary(done.checked), **sweeps.summary(done.swept)}
