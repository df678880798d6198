"""What a job's notifications say: a message when a job ends, or is flagged for idle GPUs (pure). The deployment
publishes them on its topic (jobplane.deployment.notify); the check's idle-GPU rule makes its own
(jobplane.decide.check)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.clouds.base import Notice

if TYPE_CHECKING:
    from jobplane.model.jobrecord import JobRecord


def _data(record: JobRecord, now: datetime, event: str) -> dict[str, object]:
    from jobplane.views import cost  # prices and job views: only a notice needs them, not every run that builds Notify
    from jobplane.views.jobview import runtime_seconds

    spent = cost.job_cost(record, now)
    runtime = runtime_seconds(record, now)
    return {
        "event": event, "job_id": record.id, "state": str(record.state), "reason": record.reason or "",
        "owner": record.owner, "attempt": record.attempt, "instance_type": record.instance_type or "",
        "spot": record.spec.uses_spot, "runtime_s": round(runtime) if runtime is not None else None,
        "cost_usd": round(spent.usd, 6), "cost_unpriced_attempts": spent.unpriced, "cost_basis": cost.ESTIMATED,
        "logs": f"jobplane logs {record.id}", "labels": dict(record.spec.labels),
    }


def _text(headline: str, record: JobRecord, now: datetime) -> str:
    from jobplane.views import cost  # prices and job views: only a notice needs them, not every run that builds Notify
    from jobplane.views.jobview import human_duration, runtime_seconds

    spent = cost.job_cost(record, now)
    nodes = f"{record.spec.num_nodes} x {record.instance_type or ','.join(record.spec.instance_types)}"
    return "\n".join([
        headline,
        f"owner {record.owner}, attempt {record.attempt}, {nodes}{' (Spot)' if record.spec.uses_spot else ''}",
        f"runtime {human_duration(runtime_seconds(record, now))}, estimated cost {cost.money(spent)} "
        f"(instance time x hourly price)",
        f"logs: jobplane logs {record.id}",
    ]) + "\n"


def ended(record: JobRecord, now: datetime) -> Notice:
    """demo-1122 SUCCEEDED: every rank exited 0."""
    headline = f"{record.id} {record.state}" + (f": {record.reason}" if record.reason else "")
    return Notice(f"jobplane: {record.id} {record.state}", _text(headline, record, now), _data(record, now, "ended"))


def idle(record: JobRecord, why: str, stopping: bool, now: datetime) -> Notice:
    """train-7 has idle GPUs: GPU utilization under 5% on every rank for 30m."""
    then = "; it is being stopped (it ends STALLED)" if stopping else "; it keeps running (idle_gpu.action: warn)"
    data = {**_data(record, now, "idle-gpu"), "reason": why, "action": "stop" if stopping else "warn"}
    return Notice(f"jobplane: {record.id} has idle GPUs", _text(f"{record.id} has idle GPUs: {why}{then}", record, now),
                  data)


def budget(owner: str, level: str, figures: str, *, warn_at: int, on_exceeded: str, month: str,
           then: str = "", spent: float | None = None, limit: float | None = None) -> Notice:
    """team-a has spent 82% of its budget: $412.10 of $500.00 this month (82%)."""
    if level == "exceeded":
        headline = f"{owner} has spent its budget: {figures}"
        then = then or ("its new jobs are refused until next month" if on_exceeded == "refuse"
                        else "its new jobs wait until next month")
    else:
        headline = f"{owner} has spent {warn_at}% of its budget: {figures}"
        then = "at 100% its new jobs are " + ("refused" if on_exceeded == "refuse" else "held until next month")
    text = f"{headline}\n{then} (budgets.on_exceeded: {on_exceeded}); estimated: instance time x hourly price\n" \
           f"spend by owner: jobplane cost --by owner\n"
    return Notice(f"jobplane: budget of {owner} {'spent' if level == 'exceeded' else f'at {warn_at}%'}", text,
                  {"event": f"budget-{level}", "owner": owner, "month": month, "figures": figures, "then": then,
                   "spent_usd": None if spent is None else round(spent, 6), "budget_usd": limit,
                   "warn_at_percent": warn_at, "on_exceeded": on_exceeded, "cost_basis": "estimated"})
