"""Admission records: who holds which nodes of a quota, kept in the registry and changed only by compare-and-swap.

One record per owner (`admission/owners/<owner>.json`, the owner's max_active_instances_per_owner) and, when the
policy sets max_active_instances, one for the deployment (`admission/deployment.json`). A job's attempt holds a
reservation in each from its admission (before any VM is asked for) until the attempt ends: a job is admitted
only by the write that adds its reservation, so no two launcher runs can both fill the last slot (a count of
live VMs, checked and then acted on, let four runs at once launch four jobs into a quota of two). An owner's
record also keeps the jobs waiting in its line, and the deployment's the jobs their lines cleared that wait for its
cap (its order), so they are admitted in order (jobplane.decide.admission), and what the owner's ended attempts cost
this calendar month (UTC): its budget's spend (jobplane.decide.budget) is that plus its reservations' instance time
so far at the hourly price estimated at their admission, so an admission or a check reads it with the record it
reads anyway.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from jobplane.model.records import Record
from jobplane.model.usage import InstanceSpan, billed_seconds

MAX_USD = 1e9  # a month's spend, a budget and an hourly rate are bounded by it


class Reservation(BaseModel):
    """One job's attempt holding `nodes` of a quota since `at` (its admission), or waiting for them since then."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="ignore")
    job_id: str = Field(min_length=1, max_length=63)
    attempt: int = Field(ge=1)
    owner: str = Field(min_length=1, max_length=63)
    nodes: int = Field(ge=1, le=10_000)
    at: datetime
    capped: bool = False  # in an owner's record: the attempt holds a reservation (or waits) in the deployment's too
    families: tuple[str, ...] = ()  # in an owner's record: the capped instance families' records it holds one in too
    kinds: tuple[str, ...] = ()  # every instance family its types are of, capped or not: a cap set later counts it
    ran: bool = False  # the job has run (a rerun, a retry): no budget holds it, nor a job waiting for one
    submitted: datetime | None = None  # the job's submission: the order it waits in (None: records before it)
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)  # its priority class's value (Policy.priority)
    deadline: datetime | None = None  # a waiting job's max_wait: no attempt starts after it (the backstop fails it)
    rate: float | None = Field(None, ge=0, le=MAX_USD)  # USD an hour for all its nodes: estimated at its admission
    # (the dearest type and market its spec may get), then what its VMs run as, once a check has seen them (`priced`)
    priced: bool = False  # `rate` is its VMs' types and markets as the cloud lists them, at their prices

    def running_usd(self, now: datetime, since: datetime) -> float:
        """What it has cost since `since` while it holds its nodes (jobplane.views.cost's billing rule, its
        admission standing in for its VMs' launch: the attempt's end, or the reclaim of a reservation its end did not
        give back, charges what its VMs really ran)."""
        return (self.rate or 0.0) * billed_seconds(InstanceSpan(id=self.job_id, start=self.at), now, since) / 3600

    @property
    def order(self) -> tuple[int, datetime, str]:
        """Who goes first among the waiting: the highest priority, then the oldest submission, then the id."""
        return (-self.priority, self.submitted or self.at, self.job_id)


class AdmissionRecord(Record):
    """The reservations of one quota, in admission order."""

    what: ClassVar[str] = "admission record"
    reservations: tuple[Reservation, ...] = ()  # written without defaults: a record of 1,000 waiting stays small
    waiting: tuple[Reservation, ...] = ()  # refused for want of nodes: their next attempts go in this order
    owner: str | None = Field(None, max_length=63)  # whose spend `spent` is (an owner's record, once charged)
    month: str | None = None  # "2026-11": the calendar month (UTC) `spent` counts
    spent: float = Field(0.0, ge=0, le=MAX_USD)  # USD of the attempts that ended in it, their instance time in it
    complete: bool = False  # a deployment-wide record: it counts every reservation the owners' records hold

    def spend(self, now: datetime) -> float:
        """USD this month so far: the ended attempts' and the reservations' (an estimate, as `jobplane cost` is)."""
        start = month_start(now)
        return (self.spent if self.month == month_of(now) else 0.0) + sum(
            r.running_usd(now, start) for r in self.reservations)

    def charged(self, owner: str, usd: float, now: datetime) -> AdmissionRecord:
        """With `usd` more spent by `owner` this month (a new month starts from it)."""
        base = self.spent if self.month == month_of(now) else 0.0
        return self.model_copy(update={"owner": owner, "month": month_of(now),
                                       "spent": min(MAX_USD, round(base + usd, 6))})

    def whose(self) -> str | None:
        """The owner of this (an owner's) record, as it names it."""
        return self.owner or next((r.owner for r in (*self.reservations, *self.waiting)), None)

    def used(self, *, besides: str | None = None) -> int:
        """Nodes held, not counting job `besides` (an attempt being admitted replaces its job's earlier one)."""
        return sum(r.nodes for r in self.reservations if r.job_id != besides)

    def of(self, job_id: str) -> Reservation | None:
        return next((r for r in self.reservations if r.job_id == job_id), None)

    def waiter(self, job_id: str) -> Reservation | None:
        return next((r for r in self.waiting if r.job_id == job_id), None)

    def queue(self) -> list[Reservation]:
        """The waiting jobs in the order they go."""
        return sorted(self.waiting, key=lambda r: r.order)

    def without(self, job_ids: set[str], *, waiting: bool = True) -> AdmissionRecord:
        """Neither holding nor (unless waiting=False) waiting."""
        return self.model_copy(update={
            "reservations": tuple(r for r in self.reservations if r.job_id not in job_ids),
            "waiting": tuple(r for r in self.waiting if not waiting or r.job_id not in job_ids)})

    def unqueued(self, job_ids: set[str]) -> AdmissionRecord:
        """Not waiting (whatever they hold)."""
        return self.model_copy(update={"waiting": tuple(r for r in self.waiting if r.job_id not in job_ids)})

    def holding(self, reservation: Reservation) -> AdmissionRecord:
        """With `reservation` in place of any earlier one of its job, which waits no more."""
        job_id = reservation.job_id
        return self.model_copy(update={
            "reservations": (*(r for r in self.reservations if r.job_id != job_id), reservation),
            "waiting": tuple(r for r in self.waiting if r.job_id != job_id)})

    def queued(self, reservation: Reservation) -> AdmissionRecord:
        """With `reservation` waiting, in place of any earlier wait of its job."""
        job_id = reservation.job_id
        return self.model_copy(update={"waiting": (*(r for r in self.waiting if r.job_id != job_id), reservation)})

    def marked(self, job_ids: set[str], *, family: str | None = None) -> AdmissionRecord:
        """These jobs' reservations held in the deployment's record too (or in `family`'s): a cap set while they
        ran counted them, so their release gives them back there."""
        def mark(r: Reservation) -> Reservation:
            if r.job_id not in job_ids:
                return r
            if family is None:
                return r.model_copy(update={"capped": True})
            return r.model_copy(update={"families": tuple(sorted({*r.families, family}))})
        return self.model_copy(update={"reservations": tuple(map(mark, self.reservations))})

    def by_owner(self, *, besides: str | None = None) -> dict[str, int]:
        """Nodes held per owner, not counting job `besides`."""
        out: dict[str, int] = {}
        for r in self.reservations:
            if r.job_id != besides:
                out[r.owner] = out.get(r.owner, 0) + r.nodes
        return out


def month_of(now: datetime) -> str:
    return f"{now:%Y-%m}"


def month_start(now: datetime) -> datetime:
    """The first instant of `now`'s calendar month (in its zone: UTC for every time jobplane keeps)."""
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
