"""What jobs cost, estimated from the attempts job.json records (jobplane.model.usage). Pure: no I/O.

An instance costs its attempt's hourly price times the seconds from its launch to the end of its attempt,
at least MIN_BILLED_S (EC2 and Compute Engine bill Linux VMs per second with a one-minute minimum). Only
instance time is counted: disks, public addresses, data transfer and storage are not. Every figure is an
estimate, and says so wherever it is shown.
"""

from __future__ import annotations

import math
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
# Where an attempt's hourly price came from (jobplane.model.prices)
SPOT_HISTORY, TABLE, POLICY, UNKNOWN = prices.SPOT_HISTORY, prices.TABLE, prices.POLICY, prices.UNKNOWN
SPOT_CEILING = prices.SPOT_CEILING
GROUPS = ("job", "owner", "label", "type", "market")  # and label:KEY


def hourly_price(cloud: str, instance_type: str, *, spot: bool, policy: Policy, observed_spot: float | None = None,
                 gpus: tuple[str, int] | None = None) -> tuple[float | None, str]:
    """(USD per instance-hour, where it came from) for one launch; (None, unknown) when nobody knows it
    (jobplane.model.prices.hourly, with the policy's prices)."""
    return prices.hourly(cloud, instance_type, spot=spot, book=policy, observed_spot=observed_spot, gpus=gpus)


def usd(amount: float) -> str:
    """Dollars as people read them: '$1,234.56' from $10 up, else three significant digits ('$5.00', '$0.0520',
    '$0.00173'), so a small amount is never '$0.00', which only nothing is."""
    if amount == 0:
        return "$0.00"
    if abs(amount) >= 10:
        return f"${amount:,.2f}"
    digits = min(6, max(2, 2 - math.floor(math.log10(abs(amount)))))
    return f"${amount:.{digits}f}"


def bar(percent: float, warn_at: int, width: int = 20) -> str:
    """A budget's spend as text: '[##########|###.....]', the '|' at the warn line, '>' past the end when over."""
    filled = min(width, round(width * percent / 100))
    mark = min(width - 1, round(width * warn_at / 100))
    cells = ["#" if i < filled else "." for i in range(width)]
    cells.insert(mark, "|")
    return "[" + "".join(cells) + "]" + (">" if percent > 100 else "")


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
