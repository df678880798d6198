"""Who may be admitted: pure decisions over an admission record (jobplane.model.admission).

An attempt is admitted against its owner's quota first, then each capped instance family's, then the deployment's
cap, each by compare-and-swap on its own record (the launcher writes what these decide, so the answer holds however
many runs decide at once); `reclaimable` says which reservations no live job holds any more (a launcher run that died
between its writes), for the scheduled pass to drop.

An owner's quota is a line, strict first-in first-out within a priority as Kueue's StrictFIFO and an AWS Batch job
queue are: an attempt refused for want of nodes waits in the record, and no job of the owner that comes after it
(a lower priority, or the same submitted later) is admitted while it waits, even one that would fit (a small job
never starves a big one). `next_up` says which waiting jobs a freed slot admits, so the run that frees it launches
them at once.

The deployment's cap is an order across owners (`turn`): the jobs their owners' lines cleared wait in the
deployment's record, and a freed node goes to the owner holding the fewest nodes per its weight (fair share), its
own next job first. The order is strict, as Slurm's reservation for the job at the head of its queue: a job first
in it that does not fit keeps the free nodes until it does, and no later job takes them (a backfill by time limits
would need to know when running jobs end; a training job's max_runtime is a cap, not an estimate). `fair_order`
walks the owners' lines the same way for the in-order admission.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from jobplane.model.policy import Policy

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.admission import AdmissionRecord, Reservation


RESERVATION_GRACE = 600  # s: a reservation younger than this is never reclaimed (a launcher may still be at it)


@dataclass(frozen=True)
class Quota:
    """One quota a job is admitted against: its limit in nodes, and how its reason names it."""

    limit: int
    holder: str  # "owner 'team-a'", "the deployment"
    field: str  # the policy's field that sets it
    queue: bool = True  # refused attempts wait in the record, in order (an owner's quota; not a family's cap)


@dataclass(frozen=True)
class Full:
    """The attempt does not fit: why, with the figures."""

    reason: str
    budget: bool = False  # its owner's budget stops it (jobplane.decide.budget), not the nodes in use
    never: bool = False  # it can never fit the policy in force: the launcher ends it FAILED
    ahead: tuple[Reservation, ...] = ()  # jobs the deployment's order admits first, with nodes free for them now


def owner_quota(owner: str, policy: Policy) -> Quota:
    return Quota(policy.max_active_instances_per_owner, f"owner {owner!r}", "max_active_instances_per_owner")


def cap_quota(policy: Policy) -> Quota | None:
    cap = policy.max_active_instances
    return None if cap is None else Quota(cap, "the deployment", "max_active_instances", queue=False)


def family_quota(family: str, policy: Policy) -> Quota:
    return Quota(policy.max_active_by_family[family], f"instance family {family!r}", f"max_active_by_family.{family}",
                 queue=False)


def capped_families(want: Reservation, policy: Policy) -> list[str]:
    """The capped families the job's instance types are of, as the policy stands now."""
    return sorted({*want.kinds, *want.families} & set(policy.max_active_by_family))


def never_fits(want: Reservation, policy: Policy) -> str | None:
    """Why the job can never be admitted under the policy in force (a quota or a cap lowered below its size since it
    was submitted), naming the field; None when it may."""
    limits = [(policy.max_active_instances_per_owner, "the owner quota", "max_active_instances_per_owner")]
    if policy.max_active_instances is not None:
        limits.append((policy.max_active_instances, "the deployment's cap", "max_active_instances"))
    limits += [(policy.max_active_by_family[f], f"the cap of family {f}", f"max_active_by_family.{f}")
               for f in capped_families(want, policy)]
    for limit, what, field in limits:
        if want.nodes > limit:
            return (f"num_nodes: {want.nodes} nodes can never fit {what} of {limit} active instances ({field}), as the "
                    "policy stands now")
    return None


# ---- the reasons: one wording for the launcher's records and every view (jobplane.decide.waiting.why) ----------
def over(quota: Quota, used: int, nodes: int) -> str:
    return (f"{quota.holder} has {used} active instances; {nodes} more would exceed the quota of {quota.limit} "
            f"({quota.field})")


def behind(quota: Quota, ahead: list[Reservation], used: int) -> str:
    many = len(ahead) > 1
    return (f"{len(ahead)} earlier job{'s' * many} of {quota.holder} wait{'s' * (not many)} first ({ahead[0].job_id} "
            f"next{_priority(ahead[0])}); {used} of {quota.limit} nodes in use ({quota.field})")


def _priority(waiter: Reservation) -> str:
    return f", priority {waiter.priority}" if waiter.priority else ""


def ahead_of(record: AdmissionRecord, want: Reservation, passing: Collection[str] = ()) -> list[Reservation]:
    """The owner's waiting jobs that go before `want` (a higher priority, or the same one submitted earlier), but for
    those it may pass (`passing`: jobs held by their owner's budget, to a job that ran)."""
    return [w for w in record.queue() if w.job_id != want.job_id and w.order < want.order and w.job_id not in passing]


# ---- an owner's line, a family's cap ----------------------------------------------------------------------------
def admit(record: AdmissionRecord, want: Reservation, quota: Quota, passing: Collection[str] = (),
          ) -> tuple[AdmissionRecord | None, Full | None]:
    """(the record to write, or None when nothing changes; why the attempt must wait, or None when it is admitted).
    An attempt replaces its job's earlier reservation (a retry, a rerun); one its owner's line refuses joins it
    (waiting there only: not at the deployment's cap, which it has not reached)."""
    held = record.of(want.job_id)
    if held is not None and held.attempt == want.attempt:
        return None, None
    used = record.used(besides=want.job_id)
    ahead = ahead_of(record, want, passing) if quota.queue else []
    if ahead:
        why = Full(behind(quota, ahead, used))
    elif used + want.nodes > quota.limit:
        why = Full(over(quota, used, want.nodes))
    else:
        return record.holding(want), None
    waiting = record.waiter(want.job_id)
    if not quota.queue or (waiting is not None and waiting.attempt == want.attempt and not waiting.capped):
        return None, why
    return record.queued(want.model_copy(update={"capped": False})), why


def requeue(record: AdmissionRecord, want: Reservation, *, capped: bool) -> tuple[AdmissionRecord | None, None]:
    """The owner's record with the attempt a later cap refused back in its line, where its reservation was (`capped`:
    it waits in the deployment's order too)."""
    back = want.model_copy(update={"capped": capped})
    held, waiting = record.of(want.job_id), record.waiter(want.job_id)
    if held is not None and held.attempt != want.attempt:
        return None, None  # a later attempt holds its place
    if held is None and waiting is not None and waiting.attempt == want.attempt and waiting.capped == capped:
        return None, None
    return record.without({want.job_id}, waiting=False).queued(back), None


def next_up(record: AdmissionRecord, quota: Quota) -> list[Reservation]:
    """The waiting jobs the free nodes admit now, in order: up to the first that does not fit (strict order)."""
    free, out = quota.limit - record.used(), []
    for waiter in record.queue():
        if waiter.nodes > free:
            break
        out.append(waiter)
        free -= waiter.nodes
    return out


# ---- the deployment's order --------------------------------------------------------------------------------------
def walk(waiting: Iterable[Reservation], used: Mapping[str, int], weight: Callable[[str], float], free: int | None,
         room: Mapping[str, int] | None = None) -> tuple[list[Reservation], Reservation | None]:
    """(the jobs admitted, in order; the one that stopped the walk, or None): each owner's own jobs in its order, taken
    one at a time from the owner holding the fewest nodes per its weight (a tie to the earliest job), while the
    `free` nodes last (None: no cap), strictly: the first that does not fit keeps them. A job whose capped instance
    family (`room`: free nodes per capped family) has no room for it ends its own owner's turn only (its line is
    strict; the others' jobs may be of other families)."""
    lines: dict[str, deque[Reservation]] = {}
    for w in sorted(waiting, key=lambda r: r.order):
        lines.setdefault(w.owner, deque()).append(w)
    held = {owner: float(used.get(owner, 0)) for owner in lines}
    left = dict(room or {})
    out: list[Reservation] = []
    while any(lines.values()):
        owner = min((o for o, q in lines.items() if q), key=lambda o: (held[o] / weight(o), lines[o][0].order))
        head = lines[owner][0]
        if free is not None and head.nodes > free:
            return out, head
        if any(head.nodes > left.get(f, head.nodes) for f in head.families):
            lines[owner].clear()
            continue
        lines[owner].popleft()
        out.append(head)
        held[owner] += head.nodes
        free = None if free is None else free - head.nodes
        left.update({f: left[f] - head.nodes for f in head.families if f in left})
    return out, None


def turn(record: AdmissionRecord, want: Reservation, quota: Quota, weight: Callable[[str], float],
         room: Mapping[str, int] | None = None) -> tuple[AdmissionRecord | None, Full | None]:
    """The deployment's decision on an attempt its owner's line (and its families) cleared: admitted when the cap has
    room and the order (`walk`, over the jobs waiting in the deployment's record and this one) reaches it; else it
    waits there, with why and the jobs admitted before it (for the run to launch: nobody else may be at them)."""
    held = record.of(want.job_id)
    if held is not None and held.attempt == want.attempt:
        return None, None
    used = record.used(besides=want.job_id)
    if used + want.nodes > quota.limit:
        full = Full(over(quota, used, want.nodes))
    else:
        others = [w for w in record.waiting if w.job_id != want.job_id]
        go, stop = walk([*others, want], record.by_owner(besides=want.job_id), weight, quota.limit - used, room)
        if want in go:
            return record.holding(want), None
        ahead = tuple(go)  # want is not among them: the walk admitted these before it, or stopped at it
        if stop is not None and stop.job_id != want.job_id:
            free = quota.limit - used - sum(w.nodes for w in ahead)
            why = (f"the deployment's {free} free node{'s' * (free != 1)} {'are' if free != 1 else 'is'} kept for "
                   f"{stop.job_id} of owner {stop.owner!r}, which needs {stop.nodes} and goes first by fair share")
        elif ahead:
            why = (f"{len(ahead)} job{'s' * (len(ahead) > 1)} go{'es' * (len(ahead) == 1)} first by fair share "
                   f"({ahead[0].job_id} of owner {ahead[0].owner!r} next)")
        else:
            why = f"its instance family's cap keeps it out of its owner's turn ({', '.join(want.families)})"
        full = Full(f"{why}; {used} of {quota.limit} nodes in use ({quota.field})", ahead=ahead)
    waiting = record.waiter(want.job_id)
    if waiting is not None and waiting.attempt == want.attempt:
        return None, full
    return record.queued(want), full


def fair_order(lines: list[AdmissionRecord], quota: Quota, weights: Callable[[str], float],
               free: int | None, by_family: Mapping[str, int] | None = None,
               used: Mapping[str, int] | None = None) -> list[Reservation]:
    """The waiting jobs a freed slot admits across owners: each owner's own next ones (next_up), walked as the
    deployment's order walks them (`walk`; `used`: nodes held per owner, else each line's own count)."""
    held = dict(used) if used is not None else {r.queue()[0].owner: r.used() for r in lines if r.waiting}
    return walk([w for r in lines for w in next_up(r, quota)], held, weights, free, by_family)[0]


def family_room(policy: Policy, records: Mapping[str, AdmissionRecord], besides: str | None = None) -> dict[str, int]:
    """Free nodes per capped family, from its record as read (not counting job `besides`)."""
    return {f: policy.max_active_by_family[f] - r.used(besides=besides) for f, r in records.items()
            if f in policy.max_active_by_family}


def seeded(record: AdmissionRecord, owners: Iterable[AdmissionRecord], family: str | None = None,
           ) -> tuple[AdmissionRecord, dict[str, set[str]]]:
    """A deployment-wide record (the deployment's, or `family`'s) counting what the owners' records hold that it does
    not (jobs admitted before the cap was set), marked complete; with the jobs it adopted, per owner."""
    have = {r.job_id for r in record.reservations}
    adopted: dict[str, set[str]] = {}
    found = list(record.reservations)
    for line in owners:
        for r in line.reservations:
            under = r.capped if family is None else (family in r.families or family not in r.kinds)
            if r.job_id in have or under:
                continue  # counted, not of the family, or admitted under the cap (on its way: its own write counts it)
            found.append(r.model_copy(update={"capped": False, "families": ()}))
            adopted.setdefault(r.owner, set()).add(r.job_id)
    return record.model_copy(update={"reservations": tuple(found), "complete": True}), adopted


def reclaimable(record: AdmissionRecord, holding: Collection[str], live: Collection[str], now: datetime,
                grace: int = RESERVATION_GRACE) -> set[str]:
    """The jobs whose reservations no job holding nodes keeps (`holding`: launching, running, preempted for a rerun,
    held for a look), or whose waits no job not yet ended keeps (`live`), once older than the grace."""
    old = timedelta(seconds=grace)
    return ({r.job_id for r in record.reservations if r.job_id not in holding and now - r.at >= old}
            | {r.job_id for r in record.waiting if r.job_id not in live and now - r.at >= old})
