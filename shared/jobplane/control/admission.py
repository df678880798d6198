"""Admission's I/O: a claimed attempt is admitted by adding its reservation to the admission records by
compare-and-swap (jobplane.decide.admission decides, jobplane.store.admission writes), before any VM is asked for;
the registry releases it when the attempt ends (Registry.transition); the scheduled pass reclaims what a run that
died between its writes left behind.

The owner's record is written first (its budget, its line, its quota: jobplane.decide.budget and .admission), then
each capped family's, then the deployment's, whose order (jobplane.decide.admission.turn) sees only the jobs their
owners' lines cleared; a refusal by a family or the deployment gives back what the attempt took and turns its
owner's reservation back into its wait, in its place. Each record alone never holds more than its limit, whatever
runs at once. Why a refused attempt waits is jobplane.decide.waiting.why over the records as it leaves them: the
words every view of the queue shows.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from jobplane.clouds.base import Notice, PreconditionFailed
from jobplane.decide import admission as decide
from jobplane.decide import budget, waiting
from jobplane.model import keys
from jobplane.model.policy import Policy
from jobplane.model.states import State
from jobplane.store import admission as records
from jobplane.store.rooted import RegistryError, RootedStore

if TYPE_CHECKING:  # the sweep's listings (only the scheduled pass reclaims) and the records' models (pydantic)
    from jobplane.decide.model import Snapshot
    from jobplane.model.admission import AdmissionRecord, Reservation
    from jobplane.model.jobrecord import JobRecord
    from jobplane.model.usage import AttemptUsage
    from jobplane.store.registry import Registry

log = logging.getLogger("jobplane.admission")

LIVE = (State.LAUNCHING, State.RUNNING, State.PREEMPTED)


def admit(objects: RootedStore, record: JobRecord, policy: Policy, now: datetime) -> decide.Full | None:
    """Admit the record's claimed attempt: None once its reservations are written (or were already), else why it
    must wait (jobplane.decide.waiting.why, from the records as this admission leaves them), is refused (past its
    owner's budget), or can never fit the policy in force; with the jobs the deployment's order admits first."""
    from jobplane.model.admission import Reservation  # with the record's models: a run that admits has read one

    cap, families = policy.max_active_instances, policy.families(record.spec)
    want = Reservation(job_id=record.id, attempt=record.attempt, owner=record.owner, nodes=record.spec.num_nodes,
                       at=now, capped=cap is not None, families=tuple(families), kinds=_kinds(record),
                       submitted=record.created_at, priority=policy.priority(record.spec), ran=bool(record.usage),
                       deadline=record.created_at + timedelta(seconds=policy.max_wait(record.spec)),
                       rate=_rate(record, policy))
    never = decide.never_fits(want, policy)
    if never is not None:
        return decide.Full(never, never=True)
    owner_key = keys.admission_owner(record.owner)

    def owners_turn(line: AdmissionRecord) -> tuple[AdmissionRecord | None, tuple[decide.Full | None,
                                                                                    AdmissionRecord, bool]]:
        new, full = budget.admit(line, want, decide.owner_quota(record.owner, policy), policy=policy,
                                 usage=record.usage, now=now)
        before = line.waiter(want.job_id)
        return new, (full, new or line, before is not None and before.capped)

    full, line, ordered = records.change(objects, owner_key, owners_turn)
    if full is not None:  # its owner's line holds it: it is in no deployment-wide order now
        if ordered:
            _leave_order(objects, record.id)
        return dataclasses.replace(full, reason=waiting.why(want, line, policy, now))
    held_there = want.model_copy(update={"capped": False, "kinds": ()})  # as a deployment-wide record holds it
    taken: dict[str, AdmissionRecord] = {}
    for family in families:
        quota = decide.family_quota(family, policy)
        full, counted = _shared(objects, keys.admission_family(family), family,
                                functools.partial(decide.admit, want=held_there, quota=quota))
        if full is not None:
            line = _back(objects, record, want, list(taken), capped=False, ordered=ordered)
            return dataclasses.replace(full, reason=waiting.why(want, line, policy, now, families={family: counted}))
        taken[family] = counted
    cap_quota = decide.cap_quota(policy)
    if cap_quota is None:
        return None
    found = {**taken, **{f: records.read(objects, keys.admission_family(f))[0]  # the waiting jobs' other families
                         for f in _their_families(objects, policy) if f not in taken}}
    room = decide.family_room(policy, found, besides=record.id)
    full, deployment = _shared(objects, keys.ADMISSION_DEPLOYMENT, None, lambda r: decide.turn(
        r, held_there, cap_quota, policy.weight, room))
    if full is None:
        return None
    line = _back(objects, record, want, list(taken), capped=True, ordered=False)
    return dataclasses.replace(full, reason=waiting.why(want, line, policy, now, deployment=deployment,
                                                        families=found))


def _kinds(record: JobRecord) -> tuple[str, ...]:
    from jobplane.model import accelerators

    return tuple(sorted({accelerators.family(record.spec.cloud, t) for t in record.spec.instance_types}))


def _their_families(objects: RootedStore, policy: Policy) -> set[str]:
    """The capped families of the jobs waiting in the deployment's order (a GET of its record when a family is
    capped): the order passes a job whose family is full."""
    if not policy.max_active_by_family:
        return set()
    return {f for w in records.read(objects, keys.ADMISSION_DEPLOYMENT)[0].waiting for f in w.families}


def _shared(objects: RootedStore, key: str, family: str | None,
            decision: Callable[[AdmissionRecord], tuple[AdmissionRecord | None, decide.Full | None]],
            ) -> tuple[decide.Full | None, AdmissionRecord]:
    """A deployment-wide record's decision, by compare-and-swap: (why it refused, or None; the record as it stands).
    A record its cap has never counted yet (a cap set while jobs run, or set again) first counts every reservation
    the owners' records hold (a listing and a GET each, once), and marks them held there too."""
    def decided(record: AdmissionRecord) -> tuple[AdmissionRecord | None,
                                                   tuple[decide.Full | None, AdmissionRecord] | None]:
        if not record.complete:
            return None, None  # counted first, below
        new, full = decision(record)
        return new, (full, new or record)

    for _ in range(2):
        answer = records.change(objects, key, decided)
        if answer is not None:
            return answer
        _count_all(objects, key, family)
    raise RegistryError(f"{key}: not counted after counting it")


def _count_all(objects: RootedStore, key: str, family: str | None) -> None:
    lines = owners(objects)

    def count(record: AdmissionRecord) -> tuple[AdmissionRecord | None, dict[str, set[str]]]:
        return (None, {}) if record.complete else decide.seeded(record, lines, family)

    for owner, job_ids in records.change(objects, key, count).items():
        def mark(record: AdmissionRecord, ids: set[str] = job_ids) -> tuple[AdmissionRecord | None, None]:
            new = record.marked(ids, family=family)
            return (new if new != record else None), None
        records.change(objects, keys.admission_owner(owner), mark)
    log.info("%s now counts what ran before its cap", key)


def _back(objects: RootedStore, record: JobRecord, want: Reservation, families: list[str], *, capped: bool,
          ordered: bool) -> AdmissionRecord:
    """A deployment-wide cap refused the attempt its owner admitted: the families' places it took go back, and its
    owner's reservation turns back into its wait, where it was in the line (`capped`: waiting in the deployment's
    order; `ordered`: it waited there before and no longer does). The owner's record as it stands."""
    for family in families:
        records.drop(objects, keys.admission_family(family), {record.id})
    if ordered:
        _leave_order(objects, record.id)

    def back(line: AdmissionRecord) -> tuple[AdmissionRecord | None, AdmissionRecord]:
        new = decide.requeue(line, want, capped=capped)[0]
        return new, new or line

    return records.change(objects, keys.admission_owner(record.owner), back)


def _leave_order(objects: RootedStore, job_id: str) -> None:
    """The job waits in the deployment's order no more (its owner's line or a family's cap holds it now)."""
    def leave(record: AdmissionRecord) -> tuple[AdmissionRecord | None, None]:
        new = record.unqueued({job_id})
        return (new if new != record else None), None

    records.change(objects, keys.ADMISSION_DEPLOYMENT, leave)


def _rate(record: JobRecord, policy: Policy) -> float | None:
    """USD an hour the attempt's nodes may cost, estimated before any VM is asked for: the dearest instance type and
    market its spec may get (jobplane.model.prices.dearest). The check puts what its VMs run as in its place once it
    sees them (`priced`), and the attempt's end charges its budget with the price its launch recorded."""
    from jobplane.model import prices  # only an admission estimates a rate

    price = prices.dearest(record.spec, policy)
    return None if price is None else round(price * record.spec.num_nodes, 6)


def release(objects: RootedStore, record: JobRecord) -> None:
    """A launch that found its job moved on (cancelled meanwhile): its attempt's reservation goes, unless a later
    attempt holds the job's place already."""
    held = records.read(objects, keys.admission_owner(record.owner))[0].of(record.id)
    if held is not None and held.attempt == record.attempt:
        records.release(objects, record.owner, record.id)


def reclaim(objects: Registry, snap: Snapshot, policy: Policy, now: datetime, cloud: str,
            ) -> tuple[dict[str, set[str]], list[AdmissionRecord]]:
    """After a sweep: drop the reservations and waits no job keeps (its listings say which jobs hold nodes and
    which are not yet ended), once past the grace, each dropped reservation's attempts charged to its owner's month
    in the same write (decide.budget.reclaim_charge: job.json's usage, a GET of each such job's record); price each
    owner's reservations by the VMs the cloud lists for them (decide.budget.repriced: a write the first time a check
    sees an attempt's VMs); a deployment-wide record whose cap the policy no longer sets stops counting as complete
    (a cap set again counts what runs then). One listing of admission/ and a GET per record, a write per record that
    changes. Returns (key -> jobs reclaimed, the owners' records as they now stand)."""
    live = {job_id for job_id, markers in snap.active.items() if markers}
    holding = {job_id for job_id, markers in snap.active.items() if any(m.state in LIVE for m in markers)}
    holding |= {held.job_id for held in snap.held if held.until > now}
    rates = budget.ran_rates(snap.instances, cloud, policy)

    capped = {keys.admission_family(f) for f in policy.max_active_by_family} | (
        {keys.ADMISSION_DEPLOYMENT} if policy.max_active_instances is not None else set())
    usages: dict[str, Sequence[AttemptUsage] | None] = {}

    def usage_of(job_id: str) -> Sequence[AttemptUsage] | None:
        if job_id not in usages:
            try:
                usages[job_id] = objects.job(job_id).usage
            except Exception:  # gone or unreadable: the reservation's own hours are charged instead
                log.warning("%s: no readable job.json to charge its reclaimed reservation from", job_id,
                            extra={"job_id": job_id})
                usages[job_id] = None
        return usages[job_id]

    def stale(key: str, record: AdmissionRecord) -> tuple[AdmissionRecord | None, tuple[set[str], AdmissionRecord]]:
        gone = decide.reclaimable(record, holding, live, now)  # decided again on each try: one admitted since stays
        uncapped = record.complete and key not in capped
        owners = key.startswith(keys.ADMISSION_OWNERS)
        priced = budget.repriced(record, rates) if owners and rates else record
        if not gone and not uncapped and priced == record:
            return None, (gone, record)
        charged = budget.reclaim_charge(priced, gone, usage_of, now) if owners and gone else priced
        kept = charged.without(gone, waiting=False).model_copy(update={"waiting": tuple(  # a waiting job's leaked
            w for w in record.waiting if w.job_id not in gone or w.job_id in live),  # reservation goes, not its wait
            "complete": record.complete and not uncapped})
        return kept, (gone, kept)

    dropped: dict[str, set[str]] = {}
    owners: list[AdmissionRecord] = []
    for key, _, _ in list(objects.listing(keys.ADMISSION)):
        gone, record = records.change(objects, key, functools.partial(stale, key))
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
    """The waiting jobs the free nodes admit now, in the order they go: first those that can never fit the policy in
    force (their launch ends them, naming the field, and the lines behind them go on), then each owner's line in its
    order (but an owner's jobs its budget holds till the next month), owners taken by fair share while the
    deployment's cap and their instance families' have room, as the deployment's order takes them (one GET of the
    deployment's record when the policy sets a cap, and of each capped family's that a waiting job needs)."""
    doomed = [w for line in lines for w in line.queue() if decide.never_fits(w, policy) is not None]
    lines = [line.without({w.job_id for w in doomed}) for line in lines] if doomed else lines
    cap, used = policy.max_active_instances, None
    free = None
    if cap is not None:
        deployment = records.read(objects, keys.ADMISSION_DEPLOYMENT)[0]
        free, used = cap - deployment.used(), deployment.by_owner()
    by_family = {f: limit - records.read(objects, keys.admission_family(f))[0].used()
                 for f, limit in policy.max_active_by_family.items()
                 if any(f in w.families for line in lines for w in line.waiting)}
    quota = decide.Quota(policy.max_active_instances_per_owner, "", "max_active_instances_per_owner")
    return doomed + decide.fair_order(budget.open_lines(lines, policy, now), quota, policy.weight, free, by_family,
                                      used)


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
        out.append(notices.budget(standing.owner, level, standing.figures, warn_at=standing.warn_at,
                                  on_exceeded=standing.on_exceeded, month=month, then=standing.then,
                                  spent=standing.spent, limit=standing.budget))
    return out
