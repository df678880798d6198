"""What the agent learns about its node's run as it goes, and how the run ended: shared by the core (agent/core.py),
its background loop (agent/background.py) and the job's environment (agent/environment.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobplane.model import keys, records
from jobplane.model.metrics import EARLY_STOP
from jobplane.model.spec import JobSpec

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
    data: keys.JobData | None = None  # where the job's data goes (its record says: JobRecord.data), once read
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


def hold_for(spec: JobSpec | None, outcome: Outcome) -> int:
    """Seconds this node's VM stays up after its exit report for a look (`jobplane ssh`): the spec's debug_hold
    when the attempt failed here (the job exited non-zero, the agent failed, a stop_on rule matched) or a failed
    peer's hold asked it to stop; else 0. The sweeper terminates it at the hold's end; this is the VM's own
    backstop."""
    if spec is None or not spec.debug_hold:
        return 0
    failed = outcome.reason == "exit" and outcome.code not in (0, None)
    stopped = outcome.reason == EARLY_STOP or outcome.stopped_by == records.HOLD_BY
    return spec.debug_hold if failed or stopped else 0
