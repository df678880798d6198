"""What each attempt used, as job.json records it: instance type, zone, market, hourly price, and when each
instance started and ended. jobplane.views.cost turns it into money.

An instance starts at its launch time (the cloud's, from the launch response). It ends when the control
plane moves the job off its attempt: the transition to a terminal state, to PREEMPTED, or to the next
attempt, each a CAS the reconcilers make anyway, so the end costs no extra call. That is when the check
saw the VMs finish (exit reports), vanish (lost, preempted) or had them terminated (stalled, timed out,
boot failure), give or take the VM's last seconds of shutdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Market = Literal["spot", "on-demand"]
MIN_BILLED_S = 60  # EC2 and Compute Engine bill Linux VMs per second with a one-minute minimum


class InstanceSpan(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="ignore")

    id: str
    start: datetime
    end: datetime | None = None  # None while the attempt is current


class AttemptUsage(BaseModel):
    """One launched attempt. price is USD per instance-hour at launch, None when nobody knew it."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="ignore")

    attempt: int
    instance_type: str
    zone: str | None = None
    market: Market
    price: float | None = None
    price_source: str = "unknown"  # spot price history | price table | policy | unknown
    instances: list[InstanceSpan] = Field(default_factory=list)

    @property
    def open(self) -> bool:
        return any(span.end is None for span in self.instances)

    def billed_hours(self, now: datetime, since: datetime | None = None) -> float:
        """Instance-hours to charge for this attempt (billed_seconds of each instance)."""
        return sum(billed_seconds(s, now, since) for s in self.instances) / 3600


def billed_seconds(span: InstanceSpan, now: datetime, since: datetime | None = None) -> float:
    """Seconds of this instance to charge: launch to end (or now), at least a minute; with `since`, only the
    part after it (the minimum applies to instances launched after it)."""
    end = span.end or now
    if since is not None and span.start < since:
        return max(0.0, (end - since).total_seconds())
    return max(float(MIN_BILLED_S), (end - span.start).total_seconds())


def spent(usage: Sequence[AttemptUsage], attempts: range, now: datetime, since: datetime | None = None) -> float:
    """USD the priced attempts in `attempts` cost (after `since`): jobplane.views.cost's estimate, which a budget
    (jobplane.model.admission) adds up as attempts end."""
    return sum(u.billed_hours(now, since) * u.price for u in usage if u.attempt in attempts and u.price is not None)


def close(usage: Sequence[AttemptUsage], current: int | None, now: datetime) -> list[AttemptUsage]:
    """End, at `now`, the instances of every attempt but `current` (None: of every attempt)."""
    out = []
    for used in usage:
        if used.attempt != current and used.open:
            spans = [s if s.end is not None else s.model_copy(update={"end": max(now, s.start)})
                     for s in used.instances]
            used = used.model_copy(update={"instances": spans})
        out.append(used)
    return out
