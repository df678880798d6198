"""jobs/<id>/job.json: the job's record (JobRecord) and the fields a write of it may set (Updates). Only the
registry writes it (jobplane.store.registry, by compare-and-swap); everything that decides about a job reads it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from jobplane.model.history import LastEvent
from jobplane.model.keys import DATA_LAYOUT, LIMITS_TAIL_PATTERN, JobData, active_marker
from jobplane.model.spec import JobSpec
from jobplane.model.states import TERMINAL, State
from jobplane.model.usage import AttemptUsage


class JobRecord(BaseModel):
    """jobs/<id>/job.json. Reading ignores fields it does not know (records written by an older or newer
    version); writing through Registry.transition / update refuses them (UnknownField)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="ignore")

    id: str
    spec: JobSpec
    state: State
    attempt: int = 0  # 0 until the first launch
    restarts: int = 0  # attempts after the first for a preemption or a failed boot (spec max_restarts)
    retries: int = 0  # attempts after the first for an error (spec retry.max); absent in older records: 0
    owner: str = "default"
    created_at: datetime
    updated_at: datetime
    state_since: datetime
    first_launched_at: datetime | None = None
    launched_at: datetime | None = None  # current attempt
    instances: list[str] = Field(default_factory=list)  # current attempt, by rank
    instance_type: str | None = None
    zone: str | None = None
    reason: str | None = None  # why its last transition happened, for people
    # ... and what made it, to act on: a decide.rules Rule or LaunchCause value (None before causes were recorded,
    # or from a writer that names none). A str, so a newer version's cause still reads.
    cause: str | None = None
    exit_code: int | None = None
    wait_until: datetime | None = None  # WAITING_CAPACITY: earliest next try
    waits: int = 0  # consecutive failed tries, for the backoff
    spot_refused_at: datetime | None = None  # the attempt's first refusal of Spot everywhere (spot.after counts)
    last_error: str | None = None
    held_until: datetime | None = None  # a FAILED attempt's VMs kept for a look (spec debug_hold) until then
    # the attempt's limits (nodes, stall timeout, uptime cap, the check's rules' numbers) as its RUNNING marker's
    # name carries them (keys.Limits.tail), set when it starts; None in a record written before they rode there
    limits: str | None = Field(None, pattern=LIMITS_TAIL_PATTERN, max_length=300)
    notices: list[dict[str, Any]] = Field(default_factory=list)  # Spot interruption warnings seen
    usage: list[AttemptUsage] = Field(default_factory=list)  # what each launched attempt ran on (jobplane.views.cost)
    last_event: LastEvent | None = None  # the event of the write that made this record (store/registry.py's doc)
    # where its data lives (keys.JobData): DATA_LAYOUT in a record this version created, 1 (absent) in one before
    layout: int = Field(1, ge=1, le=1000)

    @property
    def marker(self) -> str:
        """Its active/ marker's key (a RUNNING one carries the attempt's limits, once recorded)."""
        return active_marker(self.id, self.state, self.attempt, self.limits if self.state == State.RUNNING else None)

    @property
    def data(self) -> JobData:
        """Where the job's logs, metrics, checkpoints, artifacts and code are: its owner's teams/<owner>/<id>/, or
        jobs/<id>/ for a job recorded before."""
        return JobData(self.id, self.spec.owner if self.layout >= DATA_LAYOUT else None)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def held(self, now: datetime) -> bool:
        """A debug hold keeps this FAILED attempt's VMs at `now`."""
        return self.held_until is not None and now < self.held_until

    def holds_nodes(self, now: datetime) -> bool:
        """Its attempt counts against the quotas (holds its admission): launching, running, preempted for the rerun
        that follows at once, or its VMs held for a look."""
        return self.state in (State.LAUNCHING, State.RUNNING, State.PREEMPTED) or self.held(now)


class Updates(TypedDict, total=False):
    """The job.json fields a transition or an update may set besides its state, reason and cause, with their types:
    mypy checks the names a caller passes as keywords; the registry still refuses an unknown name at run time
    (UnknownField), for a caller mypy does not see."""

    attempt: int
    restarts: int
    retries: int
    state_since: datetime
    first_launched_at: datetime | None
    launched_at: datetime | None
    instances: list[str]
    instance_type: str | None
    zone: str | None
    exit_code: int | None
    wait_until: datetime | None
    waits: int
    spot_refused_at: datetime | None
    last_error: str | None
    held_until: datetime | None
    limits: str | None
    notices: list[dict[str, Any]]
    usage: list[AttemptUsage]
