"""Job notifications: a message when a job ends (or is flagged for idle GPUs), to the deployment's topic.

The messages are made by jobplane.views.notices (pure); a Notifier adapter per cloud publishes them (SNS, Pub/Sub,
the local cloud's console). A job's end is announced by the run whose compare-and-swap made the transition, through
a Registry transition listener, so overlapping reconcilers announce it exactly once; a publish that fails is
logged and counted (NotificationsFailed), never retried: at most one message per end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobplane.clouds.base import Notice, Notifier
from jobplane.deployment.telemetry import Metrics
from jobplane.model.states import TERMINAL
from jobplane.views import notices

if TYPE_CHECKING:
    from jobplane.model.jobrecord import JobRecord  # told of records the registry built

log = logging.getLogger("jobplane.notify")


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
            self.publish(notices.ended(new, new.updated_at))  # its instance time and runtime stopped at the transition
