"""What a listing of the registry hands the decisions, beside the keys it parses (jobplane.model.keys): each live
job's active/ marker, each heartbeat and output mark, each idle mark, with the LastModified the listing gave it.
The job registry (jobplane.store.registry) lists them; the pure decisions (jobplane.decide) read them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobplane.model.keys import Limits
from jobplane.model.states import State


@dataclass(frozen=True)
class ActiveMarker:
    job_id: str
    state: State
    attempt: int
    since: datetime  # the marker's LastModified: when the job entered this state
    limits: Limits | None = None  # a RUNNING marker's, from its name (None in one written before they rode there)


@dataclass(frozen=True)
class Beat:
    """One heartbeat object seen in the listing: liveness (or last output) of one rank."""

    job_id: str
    attempt: int
    rank: int
    output: bool  # True for the `.output` mark (last time the user process printed)
    at: datetime


@dataclass(frozen=True)
class IdleMark:
    """A rank's `.idle` mark in the heartbeats listing: its GPUs were idle over the policy window as of `at`."""

    job_id: str
    attempt: int
    rank: int
    at: datetime
