"""What jobs cost, estimated from the attempts job.json records (jobplane.model.usage). Pure: no I/O.

An instance costs its attempt's hourly price times the seconds from its launch to the end of its attempt,
at least MIN_BILLED_S (EC2 and Compute Engine bill Linux VMs per second with a one-minute minimum). Only
instance time is counted: disks, public addresses, data transfer and storage are not. Every figure is an
estimate, and says so wherever it is shown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobplane.model import prices

# the billing rule lives with the usage it bills, where a budget (model.admission) sums it too
from jobplane.model.usage import MIN_BILLED_S as MIN_BILLED_S
from jobplane.model.usage import billed_seconds as billed_seconds

if TYPE_CHECKING:  # annotations only: the CLI's import builds no record or policy model
    from jobplane.model.jobrecord import JobRecord
    from jobplane.model.policy import Policy
    from jobplane.model.usage import AttemptUsage

ESTIMATED = "estimated"
# Where an attempt's hourly price came from.
SPOT_HISTORY = "spot price history"
TABLE = "price table"
POLICY = "policy"
UNKNOWN = "unknown"
GROUPS = ("job", "owner", "label", "type", "market")  # and label:KEY


def hourly_price(cloud: str, instance_type: str, *, spot: bool, policy: Policy,
                 observed_spot: float | None = None) -> tuple[float | None, str]:
    """(USD per instance-hour, where it came from) for one launch; (None, unknown) when nobody knows.

    Spot: the cloud's price at launch, else the policy's spot_prices, else (GCE only) the table's on-demand
    price times GCE_SPOT_FACTOR. On-demand: the policy's prices, else the table."""
    if spot:
        if observed_spot is not None:
            return observed_spot, SPOT_HISTORY
        if instance_type in policy.spot_prices:
            return policy.spot_prices[instance_type], POLICY
        if cloud == "gcp":
            listed = _listed(cloud, instance_type, policy)
            return (round(listed[0] * prices.GCE_SPOT_FACTOR, 6), TABLE) if listed else (None, UNKNOWN)
        return None, UNKNOWN
    return _listed(cloud, instance_type, policy) or (None, UNKNOWN)


def _listed(cloud: str, instance_type: str, policy: Policy) -> tuple[float, str] | None:
    if instance_type in policy.prices:
        return policy.prices[instance_type], POLICY
    table = prices.ON_DEMAND.get(cloud, {})
    return (table[instance_type], TABLE) if instance_type in table else None


@dataclass(frozen=True)
class Cost:
    """Instance time and its estimated price. unpriced counts attempts whose hourly price is unknown: their
    time is in instance_hours but not in usd."""

    usd: float = 0.0
    instance_hours: float = 0.0
    unpriced: int = 0
    running: bool = False  # some instance has not ended: the figure grows

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.usd + other.usd, self.instance_hours + other.instance_hours, self.unpriced + other.unpriced,
                    self.running or other.running)


def attempt_cost(used: AttemptUsage, now: datetime, since: datetime | None = None) -> Cost:
    hours = used.billed_hours(now, since)
    return Cost(usd=hours * used.price if used.price is not None else 0.0, instance_hours=hours,
                unpriced=int(used.price is None), running=used.open)


def job_cost(record: JobRecord, now: datetime, since: datetime | None = None) -> Cost:
    return sum((attempt_cost(u, now, since) for u in record.usage), Cost())


def money(cost: Cost | None) -> str:
    """'~$1.23' (estimated, hence the ~), '~$0.0004' for small amounts, '?' when nothing could be priced."""
    if cost is None or (cost.unpriced and cost.usd == 0):
        return "?" if cost is not None and cost.instance_hours else "-"
    text = f"~${cost.usd:.2f}" if cost.usd >= 0.01 or cost.usd == 0 else f"~${cost.usd:.4f}"
    return text + ("+?" if cost.unpriced else "")


def describe_attempt(used: AttemptUsage, now: datetime) -> str:
    """'attempt 2: 1 x g5.xlarge spot in us-east-1a at $0.4213/h (spot price history), 1h02m -> ~$0.44'."""
    cost = attempt_cost(used, now)
    price = f"${used.price:.4f}/h ({used.price_source})" if used.price is not None else "an unknown price"
    minutes = int(cost.instance_hours * 60)
    return (f"attempt {used.attempt}: {len(used.instances)} x {used.instance_type} {used.market} in "
            f"{used.zone or 'any zone'} at {price}, {minutes // 60}h{minutes % 60:02d}m instance time"
            f"{' so far' if cost.running else ''} -> {money(cost)}")


def as_json(cost: Cost) -> dict[str, Any]:
    return {"usd": round(cost.usd, 6), "instance_hours": round(cost.instance_hours, 6), "unpriced_attempts":
            cost.unpriced, "running": cost.running, "basis": ESTIMATED}


# ---- sums ------------------------------------------------------------------------------------------------
def group_keys(record: JobRecord, by: str) -> list[str]:
    """The groups a job counts in: its id, owner, instance types, every label (key=value) or one label's value.
    A job with several labels counts once under each (--by label), so groups may add up to more than the
    total."""
    if by == "job":
        return [record.id]
    if by == "owner":
        return [record.owner]
    if by == "type":
        return sorted({u.instance_type for u in record.usage}) or ["-"]
    if by == "market":  # summarize splits a job's cost by its attempts' markets
        return sorted({u.market for u in record.usage}) or ["-"]
    labels = record.spec.labels
    if by == "label":
        return [f"{k}={v}" for k, v in sorted(labels.items())] or ["(no labels)"]
    if by.startswith("label:"):
        return [labels.get(by.removeprefix("label:"), "(none)")]
    raise ValueError(f"--by {by!r}: use one of {', '.join(GROUPS)} or label:KEY")


@dataclass(frozen=True)
class Row:
    group: str
    jobs: int
    cost: Cost

    def as_json(self, by: str) -> dict[str, Any]:
        return {by: self.group, "jobs": self.jobs, **as_json(self.cost)}


def summarize(records: Iterable[JobRecord], now: datetime, by: str = "job",
              since: datetime | None = None) -> list[Row]:
    """Cost per group of the jobs that ran instances after `since` (all time without it), dearest first."""
    totals: defaultdict[str, Cost] = defaultdict(Cost)
    counts: defaultdict[str, int] = defaultdict(int)
    for record in records:
        cost = job_cost(record, now, since)
        if not record.usage or (since is not None and cost.instance_hours == 0):
            continue
        for key in group_keys(record, by):
            # by market, each attempt counts where it ran: a Spot job's on-demand fallback is on-demand money
            totals[key] += cost if by != "market" else sum(
                (attempt_cost(u, now, since) for u in record.usage if u.market == key), Cost())
            counts[key] += 1
    return sorted((Row(k, counts[k], c) for k, c in totals.items()), key=lambda r: (-r.cost.usd, r.group))
