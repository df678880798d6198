"""Admission's I/O: a claimed attempt is admitted by adding its reservation to the admission records by
compare-and-swap (jobplane.decide.admission decides, jobplane.store.admission writes), before any VM is asked for;
the registry releases it when the attempt ends (Registry.transition); the scheduled pass reclaims what a run that
died between its writes left behind.

With a deployment-wide cap the deployment's record is written first, then the owner's; an owner's refusal takes
the deployment's reservation back (and says so: the launcher then admits in order, as others may have found the
cap full while it was held). Each record alone never holds more than its limit, whatever runs at once. The
owner's budget is decided in the owner's write, on the record it reads anyway (jobplane.decide.budget).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from jobplane.clouds.base import Notice, PreconditionFailed
from jobplane.decide import admission as decide
from jobplane.decide import budget
from jobplane.model import keys
from jobplane.model.policy import Policy
from jobplane.model.states import State
from jobplane.store import admission as records
from jobplane.store.rooted import RootedStore

if TYPE_CHECKING:  # the sweep's listings (only the scheduled pass reclaims) and the records' models (pydantic)
    from jobplane.decide.model import Snapshot
    from jobplane.model.admission import AdmissionRecord, Reservation
    from jobplane.model.jobrecord import JobRecord

log = logging.getLogger("jobplane.admission")

LIVE = (State.LAUNCHING, State.RUNNING, State.PREEMPTED)


def admit(objects: RootedStore, record: JobRecord, policy: Policy, now: datetime) -> decide.Full | None:
    """Admit the record's claimed attempt: None once its reservations are written (or were already), else why it
    must wait (or, past its owner's budget, is refused), with the figures."""
    from jobplane.model.admission import Reservation  # with the record's models: a run that admits has read one

    cap, families = policy.max_active_instances, policy.families(record.spec)
    want = Reservation(job_id=record.id, attempt=record.attempt, owner=record.owner, nodes=record.spec.num_nodes,
                       at=now, capped=cap is not None, families=tuple(families), submitted=record.created_at,
                       priority=policy.priority(record.spec),
                       deadline=record.created_at + timedelta(seconds=policy.max_wait(record.spec)),
                       rate=_rate(record, policy))
    shared = ([(keys.ADMISSION_DEPLOYMENT, decide.Quota(cap, "the deployment", "max_active_instances", queue=False))]
              if cap is not None else []) + [
        (keys.admission_family(f), decide.Quota(policy.max_active_by_family[f], f"instance family {f!r}",
                                                f"max_active_by_family.{f}", queue=False)) for f in families]
    held_there = want.model_copy(update={"capped": False, "families": ()})  # as a deployment-wide record holds it
    taken: list[str] = []
    for key, quota in shared:  # the deployment-wide caps first, each its own record
        full = records.change(objects, key, functools.partial(decide.admit, want=held_there, quota=quota))
        if full is not None:  # it waits in its owner's line, where the fair share across owners picks it up
            for held in taken:
                records.drop(objects, held, {record.id})
            records.change(objects, keys.admission_owner(record.owner), lambda r: decide.wait(r, want))
            return full
        taken.append(key)
    owner = decide.Quota(policy.max_active_instances_per_owner, f"owner {record.owner!r}",
                         "max_active_instances_per_owner")
    full = records.change(objects, keys.admission_owner(record.owner), lambda r: budget.admit(
        r, want, owner, policy=policy, usage=record.usage, now=now))
    if full is None:
        return None
    for held in taken:
        records.drop(objects, held, {record.id})
    return dataclasses.replace(full, gave_back=bool(taken))


def _rate(record: JobRecord, policy: Policy) -> float | None:
    """USD an hour the attempt's nodes will cost, estimated before any VM is asked for (jobplane.views.cost's
    price for its first instance type: Spot's where the policy or the table gives it, else on-demand's, the most
    it may cost). The attempt's end charges its budget with the price its launch recorded."""
    from jobplane.views import cost  # the price table: only an admission estimates a rate

    spec = record.spec
    kind = spec.instance_types[0]
    price = cost.hourly_price(spec.cloud, kind, spot=spec.uses_spot, policy=policy)[0]
    if price is None:
        price = cost.hourly_price(spec.cloud, kind, spot=False, policy=policy)[0]
    return None if price is None else round(price * spec.num_nodes, 6)


def release(objects: RootedStore, record: JobRecord) -> None:
    """A launch that found its job moved on (cancelled meanwhile): its attempt's reservation goes, unless a later
    attempt holds the job's place already."""
    held = records.read(objects, keys.admission_owner(record.owner))[0].of(record.id)
    if held is not None and held.attempt == record.attempt:
        records.release(objects, record.owner, record.id)


def reclaim(objects: RootedStore, snap: Snapshot, now: datetime,
            ) -> tuple[dict[str, set[str]], list[AdmissionRecord]]:
    """After a sweep: drop the reservations and waits no job keeps (its listings say which jobs hold nodes and
    which are not yet ended), once past the grace. One listing of admission/ and a GET per record, a write per
    record that changes. Returns (key -> jobs reclaimed, the owners' records as they now stand)."""
    live = {job_id for job_id, markers in snap.active.items() if markers}
    holding = {job_id for job_id, markers in snap.active.items() if any(m.state in LIVE for m in markers)}
    holding |= {held.job_id for held in snap.held if held.until > now}

    def stale(record: AdmissionRecord) -> tuple[AdmissionRecord | None, tuple[set[str], AdmissionRecord]]:
        gone = decide.reclaimable(record, holding, live, now)  # decided again on each try: one admitted since stays
        if not gone:
            return None, (gone, record)
        kept = record.without(gone, waiting=False).model_copy(update={"waiting": tuple(  # a waiting job's leaked
            w for w in record.waiting if w.job_id not in gone or w.job_id in live)})  # reservation goes, not its wait
        return kept, (gone, kept)

    dropped: dict[str, set[str]] = {}
    owners: list[AdmissionRecord] = []
    for key, _, _ in list(objects.listing(keys.ADMISSION)):
        gone, record = records.change(objects, key, stale)
        if gone:
            log.warning("%s: reclaimed the reservations of %s (no live job holds them)", key, sorted(gone))
            dropped[key] = gone
        if key.startswith(keys.ADMISSION_OWNERS):
            owners.append(record)
    return dropped, owners


def owners(objects: RootedStore) -> list[AdmissionRecord]:
    """Every owner's admission record: one listing and a GET each."""
    return [records.read(objects, key)[0] for key, _, _ in list(objects.listing(keys.ADMISSION_OWNERS))]


def in_order(objects: RootedStore, lines: list[AdmissionRecord], policy: Policy, now: datetime,
             ) -> list[Reservation]:
    """The waiting jobs the free nodes admit now, in the order they go: each owner's line in its order (but an owner
    waiting for its budget's next month), owners taken by fair share while the deployment's cap and their instance
    families' have room (one GET of the deployment's record when the policy sets a cap, and of each capped family's
    that a waiting job needs)."""
    cap = policy.max_active_instances
    free = None if cap is None else cap - records.read(objects, keys.ADMISSION_DEPLOYMENT)[0].used()
    by_family = {f: limit - records.read(objects, keys.admission_family(f))[0].used()
                 for f, limit in policy.max_active_by_family.items()
                 if any(f in w.families for line in lines for w in line.waiting)}
    quota = decide.Quota(policy.max_active_instances_per_owner, "", "max_active_instances_per_owner")
    return decide.fair_order(budget.open_lines(lines, policy, now), quota, policy.weight, free, by_family)


def in_line(found: list[AdmissionRecord], now: datetime) -> set[str]:
    """The jobs waiting in an owner's line before their max_wait: no retry of theirs could pass the ones before
    them, so the backstop leaves them be (the in-order admission launches them)."""
    return {w.job_id for record in found for w in record.waiting if w.deadline is not None and w.deadline > now}


def budget_notices(objects: RootedStore, lines: list[AdmissionRecord], policy: Policy, now: datetime,
                   ) -> list[Notice]:
    """The notices owners are due this month (their spend reached warn_at_percent, or their budget), from their
    records as a run read them anyway: each told once, by the run whose create-only write of its marker lands.
    Nothing due: no call; else one listing of this month's markers, and a write per notice."""
    due = budget.to_tell(lines, policy, now)
    if not due:
        return []
    from jobplane.model.admission import month_of
    from jobplane.views import notices  # only a run that finds an owner past a level tells it

    month = month_of(now)
    told = {key for key, _, _ in objects.listing(f"{keys.BUDGET_NOTICES}{month}/")}
    out = []
    for standing, level in due:
        key = keys.budget_notice(month, standing.owner, level)
        if key in told:
            continue
        try:
            objects.put_if_absent(key, standing.figures.encode(), "text/plain")
        except PreconditionFailed:  # another run told it
            continue
        log.info("budget of %s: %s (%s)", standing.owner, standing.figures, level)
        out.append(notices.budget(standing.owner, level, standing.figures, warn_at=policy.budgets.warn_at_percent,
                                  on_exceeded=policy.budgets.on_exceeded, month=month))
    return out
