"""A job's max_cost (the spec's, else the policy's default, within its ceiling): the check's two rules over it.

When the job's estimated cost (jobplane.views.cost: every attempt's instance time at its launch's price) reaches
max_cost, its RUNNING attempt gets the stop request the uptime cap sends (by `max-cost`), so its agents checkpoint and
exit; once every rank has exited on it, or the policy's stop grace after it is over, the attempt ends FAILED, its
VMs terminated, the reason naming max_cost. The filter reads two numbers its RUNNING marker's name carries (no GET):
`costleft`, the cents of max_cost its earlier attempts left, and `centsph`, what its VMs cost an hour (rounded up),
from the instances' launch in the cloud's listing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.decide.effects import RequestStop, Terminate, Transition
from jobplane.decide.jobrule import JobRule, Listed, Seen
from jobplane.decide.model import Action, Rule, age, claim
from jobplane.decide.safety import terminable
from jobplane.model.policy import Policy
from jobplane.model.states import State, StopBy

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.jobrecord import JobRecord

MAX_COST_BY = StopBy.MAX_COST


def money(usd: float) -> str:
    from jobplane.views.cost import usd as shown  # one way to show dollars everywhere

    return shown(usd)


def _rate(record: JobRecord) -> float:
    """USD an hour the current attempt's VMs cost (its launch's price x its instances; 0: unknown)."""
    used = next((u for u in record.usage if u.attempt == record.attempt), None)
    return (used.price or 0.0) * max(1, len(used.instances)) if used is not None else 0.0


def _spent(record: JobRecord, now: datetime) -> float:
    from jobplane.views import cost  # the estimate every view shows

    return cost.job_cost(record, now).usd


def numbers(record: JobRecord, policy: Policy) -> Mapping[str, int]:
    """The numbers its filter reads, when the job has a max_cost: cents of it left when the attempt started
    RUNNING, and cents an hour its VMs cost (rounded up, so the filter reads the record early, never late)."""
    cap = policy.max_cost(record.spec)
    if cap is None:
        return {}
    from jobplane.views import cost

    earlier = sum(cost.attempt_cost(u, record.state_since).usd for u in record.usage if u.attempt != record.attempt)
    return {"costleft": max(0, math.floor((cap - earlier) * 100)), "centsph": math.ceil(_rate(record) * 100)}


def near(job: Listed) -> bool:
    """From the listings alone: the attempt's VMs, at the rate its marker carries, may have spent what was left."""
    left, rate = (job.limits.fact("costleft"), job.limits.fact("centsph")) if job.limits is not None else (None, None)
    if left is None or rate is None:
        return False
    start = min((i.launched_at for i in job.instances), default=job.since)
    return age(job.now, start) / 3600 * rate >= left


def _reached(job: Seen) -> tuple[float, float, float] | None:
    """(its max_cost, what it has cost, its rate) once the estimate has reached max_cost."""
    cap = job.policy.max_cost(job.record.spec)
    if cap is None:
        return None
    spent = _spent(job.record, job.now)
    return (cap, spent, _rate(job.record)) if spent >= cap else None


def _end(job: Seen, spent: float, cap: float) -> Action:
    return claim(job.record, Rule.COST_STOPPED, Rule.COST_STOPPED.reason(spent=money(spent), cap=money(cap)),
                 Transition(State.FAILED), Terminate(terminable(job.instances)))


def stopped(job: Seen) -> Action | None:
    """Every rank has exited, one on the max_cost stop request: FAILED naming max_cost."""
    ranks = range(job.record.spec.num_nodes)
    if not all(r in job.exits for r in ranks) or not any(job.exits[r].stopped_by == MAX_COST_BY for r in ranks):
        return None
    cap = job.policy.max_cost(job.record.spec)
    return _end(job, _spent(job.record, job.now), cap if cap is not None else 0.0)


def stop(job: Seen) -> Action | None:
    """The estimate reached max_cost: ask the attempt to stop (again each check: a repeated request is harmless);
    the stop grace's worth of instance time later, end it."""
    if job.record.state != State.RUNNING:
        return None
    reached = _reached(job)
    if reached is None:
        return None
    cap, spent, rate = reached
    if spent >= cap + rate * job.policy.safety.stop_grace / 3600:  # a rank that never stops does not keep the rest
        return _end(job, spent, cap)
    if job.exits:  # some ranks have stopped: the others were asked, and the grace ends them
        return None
    return claim(job.record, Rule.COST_STOP, Rule.COST_STOP.reason(cap=money(cap), spent=money(spent)),
                 RequestStop(by=MAX_COST_BY))


ENDED = JobRule(Rule.COST_STOPPED, stopped)
RULE = JobRule(Rule.COST_STOP, stop, near, also=(Rule.COST_STOPPED,), limits=numbers)
