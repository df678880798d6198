"""What the agent learns about its node's run as it goes, and how the run ended: shared by the core (agent/core.py),
its background loop (agent/background.py) and the job's environment (agent/environment.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobplane import records
from jobplane.spec import JobSpec

AGENT_ERROR = 125  # exit code when the agent itself could not run the job (like `docker run`)


@dataclass
class Run:
    """What the agent learned about its job, filled in as it goes."""

    job_id: str
    attempt: int
    rank: int
    instance_id: str
    started_at: datetime
    spec: JobSpec | None = None
    phase: str = "starting"


@dataclass
class Outcome:
    code: int | None
    reason: records.ExitReason
    notice: dict[str, str] | None = None
    error: str | None = None
    signal: str | None = None  # "SIGTERM" when a signal asked the agent to stop
    deadline: float | None = None  # the clock's monotonic() by which the VM is gone, when a signal says so
    stopped_by: str | None = None  # the stop request's `by` (uptime-cap, idle-gpu, cli), for the exit report
    stop_reason: str | None = None
