"""Who may be admitted: pure decisions over an admission record (jobplane.model.admission).

`admit` says whether an attempt fits a quota as the record stands and gives the record with its reservation (the
launcher writes it by compare-and-swap, so the answer holds however many runs decide at once); `reclaimable` says
which reservations no live job holds any more (a launcher run that died between its writes), for the scheduled
pass to drop.

An owner's quota is a queue, strict first-in first-out within a priority as Kueue's StrictFIFO and an AWS Batch job
queue are: an attempt refused for want of nodes waits in the record, and no job of the owner that comes after it
(a lower priority, or the same submitted later) is admitted while it waits, even one that would fit (a small job
never starves a big one). `next_up` says which waiting jobs a
freed slot admits, so the run that frees it launches them at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.admission import AdmissionRecord, Reservation


RESERVATION_GRACE = 600  # s: a reservation younger than this is never reclaimed (a launcher may still be at it)


@dataclass(frozen=True)
class Quota:
    """One quota a job is admitted against: its limit in nodes, and how its reason names it."""

    limit: int
    holder: str  # "owner 'team-a'", "the deployment"
    field: str  # the policy's field that sets it
    queue: bool = True  # refused attempts wait in the record, in order (an owner's quota; not the deployment's cap)


@dataclass(frozen=True)
class Full:
    """The attempt does not fit: why, with the figures."""

    reason: str
    budget: bool = False  # its owner's budget stops it (jobplane.decide.budget), not the nodes in use
    gave_back: bool = False  # its owner refused it after a deployment-wide cap admitted it: that slot is free again


def admit(record: AdmissionRecord, want: Reservation, quota: Quota) -> tuple[AdmissionRecord | None, Full | None]:
    """(the record to write, or None when nothing changes; why the attempt must wait, or None when it is admitted).
    An attempt replaces its job's earlier reservation (a retry, a rerun); a refused one joins the queue."""
    held = record.of(want.job_id)
    if held is not None and held.attempt == want.attempt:
        return None, None
    used = record.used(besides=want.job_id)
    ahead = [w for w in record.queue() if w.job_id != want.job_id and w.order < want.order] if quota.queue else []
    if ahead:
        why = Full(f"{len(ahead)} earlier job{'s' * (len(ahead) > 1)} of {quota.holder} wait{'s' * (len(ahead) == 1)} "
                   f"first ({ahead[0].job_id} next{_priority(ahead[0])}); {used} of {quota.limit} nodes in use "
                   f"({quota.field})")
    elif used + want.nodes > quota.limit:
        why = Full(f"{quota.holder} has {used} active instances; {want.nodes} more would exceed the quota of "
                   f"{quota.limit} ({quota.field})")
    else:
        return record.holding(want), None
    waiting = record.waiter(want.job_id)
    if not quota.queue or (waiting is not None and waiting.attempt == want.attempt):
        return None, why
    return record.queued(want), why


def fair_order(lines: list[AdmissionRecord], quota: Quota, weights: Callable[[str], float],
               free: int | None, by_family: Mapping[str, int] | None = None) -> list[Reservation]:
    """The waiting jobs a freed slot admits across owners: each owner's own next ones (next_up), taken one at a
    time from the owner holding the fewest nodes per its weight (fair share; a tie goes to the earliest), while
    the deployment's `free` nodes last (None: no cap), strictly: the first that does not fit ends it. A job whose
    instance family's cap (`by_family`: free nodes per capped family) has no room for it ends its own owner's
    turn only (its line is strict; the others' jobs may be of other families)."""
    heads = {r.queue()[0].owner: (r.used(), deque(next_up(r, quota))) for r in lines if r.waiting}
    used = {owner: float(held) for owner, (held, _) in heads.items()}
    room = dict(by_family or {})
    out: list[Reservation] = []
    while any(q for _, q in heads.values()):
        owner = min((o for o, (_, q) in heads.items() if q),
                    key=lambda o: (used[o] / weights(o), heads[o][1][0].order))
        waiter = heads[owner][1][0]
        if free is not None and waiter.nodes > free:
            break
        if any(waiter.nodes > room.get(f, waiter.nodes) for f in waiter.families):
            heads[owner][1].clear()
            continue
        heads[owner][1].popleft()
        out.append(waiter)
        used[owner] += waiter.nodes
        free = None if free is None else free - waiter.nodes
        room.update({f: room[f] - waiter.nodes for f in waiter.families if f in room})
    return out


def _priority(waiter: Reservation) -> str:
    return f", priority {waiter.priority}" if waiter.priority else ""


def wait(record: AdmissionRecord, want: Reservation) -> tuple[AdmissionRecord | None, None]:
    """The record with the attempt waiting in its line (refused by the deployment's cap, not this quota)."""
    waiting = record.waiter(want.job_id)
    if (waiting is not None and waiting.attempt == want.attempt) or record.of(want.job_id) is not None:
        return None, None
    return record.queued(want), None


def next_up(record: AdmissionRecord, quota: Quota) -> list[Reservation]:
    """The waiting jobs the free nodes admit now, in order: up to the first that does not fit (strict order)."""
    free, out = quota.limit - record.used(), []
    for waiter in record.queue():
        if waiter.nodes > free:
            break
        out.append(waiter)
        free -= waiter.nodes
    return out


def reclaimable(record: AdmissionRecord, holding: Collection[str], live: Collection[str], now: datetime,
                grace: int = RESERVATION_GRACE) -> set[str]:
    """The jobs whose reservations no job holding nodes keeps (`holding`: launching, running, preempted for a rerun,
    held for a look), or whose waits no job not yet ended keeps (`live`), once older than the grace."""
    old = timedelta(seconds=grace)
    return ({r.job_id for r in record.reservations if r.job_id not in holding and now - r.at >= old}
            | {r.job_id for r in record.waiting if r.job_id not in live and now - r.at >= old})
