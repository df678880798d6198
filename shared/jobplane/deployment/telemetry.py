"""Metrics seam: core code counts what it does; each handler decides where the numbers go.

AWS handlers pass Powertools Metrics (EMF to CloudWatch); GCP functions and the local cloud pass
LogMetrics; tests pass CountingMetrics and assert on it. Logging is stdlib `logging` with `job_id` in
`extra`, which Powertools' Logger formats as JSON once the handler copies its config to our loggers.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Protocol

log = logging.getLogger("jobplane")


class Metrics(Protocol):
    def add_metric(self, name: str, unit: str, value: float) -> None: ...


class CountingMetrics:
    """Keeps totals in memory (tests, benchmarks)."""

    def __init__(self) -> None:
        self.totals: defaultdict[str, float] = defaultdict(float)

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.totals[name] += value


class LogMetrics:
    """Writes each metric as one structured log line (GCP: a log-based metric picks it up)."""

    def add_metric(self, name: str, unit: str, value: float) -> None:
        log.info("metric %s=%s %s", name, value, unit, extra={"metric": name, "value": value, "unit": unit})
