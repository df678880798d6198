"""Job notifications: a message when a job ends (or is flagged for idle GPUs), to the deployment's topic.

The messages are made here (pure); a Notifier adapter per cloud publishes them (SNS, Pub/Sub, the local
cloud's console). A job's end is announced by the run whose compare-and-swap made the transition, through
a Registry transition listener, so overlapping reconcilers announce it exactly once; a publish that fails is
logged and counted (NotificationsFailed), never retried: at most one message per end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from jobplane.clouds.base import Notice, Notifier
from jobplane.deployment.telemetry import Metrics
from jobplane.model.states import TERMINAL
from jobplane.store.registry import JobRecord

log = logging.getLogger("jobplane.notify")


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


@dataclass
class Notify:
    """Publishes notices, counting what was sent and what failed; with no notifier (no topic), does nothing."""

    notifier: Notifier | None
    metrics: Metrics

    def publish(self, notice: Notice) -> bool:
        if self.notifier is None:
            return False
        try:
            self.notifier.publish(notice)
        except Exception as exc:
            log.warning("notification %r not published: %s", notice.subject, exc,
                        extra={"job_id": notice.data.get("job_id")})
            self.metrics.add_metric("NotificationsFailed", "Count", 1)
            return False
        self.metrics.add_metric("NotificationsPublished", "Count", 1)
        return True

    def transition(self, old: JobRecord, new: JobRecord) -> None:
        """A Registry transition listener: a job that has just ended gets its notification."""
        if new.state in TERMINAL and old.state not in TERMINAL:
            self.publish(ended(new, new.updated_at))  # its instance time and runtime stopped at the transition
