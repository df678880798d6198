"""Budgets: pure decisions over an owner's spend this month, its budget and the policy (`budgets:`).

The spend is the owner's admission record's (jobplane.model.admission: its ended attempts' cost this month plus its
reservations' so far, by jobplane.views.cost's estimate), read by the admission and the check with the record they
read anyway. At `warn_at_percent` the owner is told once; at its budget a new job (one that has not run yet) is
refused or waits in its owner's line until the month turns (`on_exceeded`). An attempt of a job that has run (a
retry, a rerun) is no new spending decision and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from jobplane.decide import admission
from jobplane.model.policy import Policy

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.clouds.base import Instance
    from jobplane.model.admission import AdmissionRecord, Reservation
    from jobplane.model.usage import AttemptUsage


@dataclass(frozen=True)
class Budget:
    owner: str
    spent: float  # USD this month so far
    budget: float  # USD a month
    warn_at: int = 80  # the policy's warn_at_percent
    on_exceeded: str = "refuse"  # what happens to the owner's new jobs at its budget: refuse or wait
    month: str = ""  # "2026-11": the calendar month (UTC) `spent` counts

    @property
    def percent(self) -> float:
        return 100 * self.spent / self.budget

    @property
    def over(self) -> bool:
        return self.spent >= self.budget

    def level(self) -> Level:
        if self.over:
            return Level.EXCEEDED
        return Level.WARNING if self.percent >= self.warn_at else Level.OK

    def as_json(self) -> dict[str, object]:
        return {"budget_usd": self.budget, "spent_this_month_usd": round(self.spent, 6),
                "budget_percent": round(self.percent, 2), "warn_at_percent": self.warn_at,
                "level": str(self.level()), "on_exceeded": self.on_exceeded, "then": self.then}

    @property
    def figures(self) -> str:
        """'$512.00 of $500.00 this month (102%)', '$0.0520 of $5.00 this month (1.0%)'."""
        from jobplane.views.cost import usd  # one way to show dollars everywhere

        percent = f"{self.percent:.0f}" if self.percent >= 10 or self.percent == 0 else f"{self.percent:.1f}"
        return f"{usd(self.spent)} of {usd(self.budget)} this month ({percent}%)"

    @property
    def then(self) -> str:
        """What happens to the owner's jobs: 'new jobs refused until 2026-12' (over), 'new jobs refused at 100%'."""
        verb = "refused" if self.on_exceeded == "refuse" else "wait"
        nxt = _next_month(self.month) if self.month else "next month"
        if self.over:
            return f"new jobs {verb} until {nxt}; jobs that ran go on"
        warned = f" (warned at {self.warn_at}%)" if self.level() == Level.WARNING else ""
        return f"new jobs {verb} at 100%{warned}"

    @property
    def reason(self) -> str:
        """Why a job of an owner past its budget does not start: 'budget: $512.00 of $500.00 this month for
        team-a'."""
        from jobplane.views.cost import usd

        return f"budget: {usd(self.spent)} of {usd(self.budget)} this month for {self.owner} (budgets.monthly_usd)"


def _next_month(month: str) -> str:
    year, number = (int(part) for part in month.split("-"))
    return f"{year + number // 12}-{number % 12 + 1:02d}"


class Level(StrEnum):
    """Where an owner's spend stands against its budget; each but OK is told once a month."""

    OK = "ok"
    WARNING = "warning"
    EXCEEDED = "exceeded"


def standing(owner: str, record: AdmissionRecord, policy: Policy, now: datetime) -> Budget | None:
    """The owner's spend against its budget (None: the policy gives it none)."""
    from jobplane.model.admission import month_of

    budget = policy.budgets.limit(owner)
    return None if budget is None else Budget(owner, record.spend(now), budget, policy.budgets.warn_at_percent,
                                                policy.budgets.on_exceeded_for(owner), month_of(now))


def exceeded(owner: str, record: AdmissionRecord, policy: Policy, now: datetime) -> Budget | None:
    """The owner's standing when it is at or past its budget, else None."""
    found = standing(owner, record, policy, now)
    return found if found is not None and found.level() == Level.EXCEEDED else None


def holds(want: Reservation, record: AdmissionRecord, policy: Policy, now: datetime) -> Budget | None:
    """The owner's standing when its budget holds this job: a new one (that has not run) of an owner at its budget."""
    return None if want.ran else exceeded(want.owner, record, policy, now)


def passing(want: Reservation, record: AdmissionRecord, policy: Policy, now: datetime) -> set[str]:
    """The jobs of the owner's line a job that ran may pass: those its owner's budget holds (`on_exceeded: wait`)."""
    if not want.ran or policy.budgets.on_exceeded_for(want.owner) != "wait" \
            or exceeded(want.owner, record, policy, now) is None:
        return set()
    return {w.job_id for w in record.waiting if not w.ran}


def admit(record: AdmissionRecord, want: Reservation, quota: admission.Quota, *, policy: Policy,
          usage: list[AttemptUsage], now: datetime) -> tuple[AdmissionRecord | None, admission.Full | None]:
    """decide.admission.admit behind the owner's budget: a job that has not run yet (no `usage`) and whose owner is
    at its budget is refused (the record unchanged: it leaves the owner's line) or waits in the line, per
    `on_exceeded`; a job that ran passes the jobs its owner's budget holds. An attempt that replaces its job's earlier
    reservation charges the month with what the attempts since that one cost (as a release would have), in the same
    write."""
    from jobplane.model.admission import month_start  # with the records' models, as an owner's line
    from jobplane.model.usage import spent

    held = record.of(want.job_id)
    if not usage and (held is None or held.attempt != want.attempt):
        over = exceeded(want.owner, record, policy, now)
        if over is not None:
            if policy.budgets.on_exceeded_for(want.owner) == "refuse":
                waited = record.waiter(want.job_id) is not None
                return (record.without({want.job_id}) if waited else None), admission.Full(over.reason, budget=True)
            waiting = record.waiter(want.job_id)
            new = None if waiting is not None and waiting.attempt == want.attempt and not waiting.capped else \
                record.queued(want.model_copy(update={"capped": False}))
            return new, admission.Full(over.reason, budget=True)
    new, full = admission.admit(record, want, quota, passing(want, record, policy, now))
    if new is not None and held is not None and held.attempt < want.attempt and new.of(want.job_id) == want:
        new = new.charged(want.owner, spent(usage, range(held.attempt, want.attempt), now, month_start(now)), now)
    return new, full


def open_lines(lines: list[AdmissionRecord], policy: Policy, now: datetime) -> list[AdmissionRecord]:
    """The owners' lines a freed slot may take jobs from: with `on_exceeded: wait`, an owner at its budget's line
    holds only its jobs that ran (the others wait for the next month); with `refuse`, every line (a job it admits is
    refused then)."""
    return [r if not r.waiting or policy.budgets.on_exceeded_for(r.waiting[0].owner) != "wait"
            or exceeded(r.waiting[0].owner, r, policy, now) is None
            else r.model_copy(update={"waiting": tuple(w for w in r.waiting if w.ran)}) for r in lines]


def to_tell(lines: list[AdmissionRecord], policy: Policy, now: datetime) -> list[tuple[Budget, Level]]:
    """The owners whose spend has reached a level worth telling (warning, exceeded) this month, from their
    records."""
    out: list[tuple[Budget, Level]] = []
    for record in lines:
        owner = record.whose()
        found = standing(owner, record, policy, now) if owner is not None else None
        if found is not None and (level := found.level()) != Level.OK:
            out.append((found, level))
    return out


def ran_rates(instances: Iterable[Instance], cloud: str, policy: Policy) -> dict[tuple[str, int], float]:
    """USD an hour each attempt's live VMs cost, (job, attempt) -> rate, from the cloud's listing: each VM's type and
    market at its price (jobplane.model.prices.hourly; an EC2 Spot VM at its ceiling, the on-demand price, as the
    cloud's price at launch is in job.json alone). An attempt with a VM nobody prices is left out, and so is one on
    a GCE N1 type, whose GPUs (guestAccelerators) the listing does not say: its estimate, which counts them, stands."""
    from jobplane.decide.model import alive
    from jobplane.model import accelerators, prices

    out: dict[tuple[str, int], float] = {}
    unknown: set[tuple[str, int]] = set()
    for vm in instances:
        if vm.job_id is None or vm.attempt is None or not alive(vm):
            continue
        at = (vm.job_id, vm.attempt)
        n1 = cloud == "gcp" and vm.instance_type is not None and accelerators.family(cloud, vm.instance_type) == "n1"
        price = prices.hourly(cloud, vm.instance_type, spot=vm.spot, book=policy)[0] \
            if vm.instance_type and not n1 else None
        if price is None:
            unknown.add(at)
        else:
            out[at] = out.get(at, 0.0) + price
    return {at: round(rate, 6) for at, rate in out.items() if at not in unknown}


def repriced(record: AdmissionRecord, rates: Mapping[tuple[str, int], float]) -> AdmissionRecord:
    """The owner's reservations at the rates their VMs run at (`ran_rates`), in place of their admission's estimate:
    the spend charges the type and market an attempt got, not the dearest it might have. Once priced, a rate only
    rises (a rank whose VM has gone before the others does not make the attempt's hours so far cheaper)."""
    def ran(r: Reservation) -> Reservation:
        rate = rates.get((r.job_id, r.attempt))
        if rate is None or (r.priced and r.rate is not None and r.rate >= rate):
            return r
        return r.model_copy(update={"rate": rate, "priced": True})
    return record.model_copy(update={"reservations": tuple(map(ran, record.reservations))})


def reclaim_charge(record: AdmissionRecord, gone: set[str], usage_of: Callable[[str], Sequence[AttemptUsage] | None],
                   now: datetime) -> AdmissionRecord:
    """The owner's record charged with what the reservations the reclaim drops cost this month, in the write that
    drops them (a reservation its attempt's end did not give back: a failed write, a crash): their attempts' usage
    as job.json records it when it can be read, else the reservation's own hours at its rate until now. Never
    zero for an attempt that ran, never twice (the reservation goes in the same write)."""
    from jobplane.model.admission import month_start
    from jobplane.model.usage import spent

    usd = 0.0
    for held in record.reservations:
        if held.job_id not in gone:
            continue
        usage = usage_of(held.job_id)
        usd += held.running_usd(now, month_start(now)) if usage is None else \
            spent(usage, range(held.attempt, 1 << 30), now, month_start(now))
    owner = record.whose()
    return record if usd == 0 or owner is None else record.charged(owner, usd, now)
