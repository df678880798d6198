"""A job's history: the objects under jobs/<id>/events/, one model per kind, written by the functions (through
jobplane.store.registry) and read as JSON by `jobplane describe`. Like jobplane.model.records, one model serves
every writer of a kind, so a body's fields are named and typed in one place; the writer adds `time` and `kind`.

Also the record's copy of its last event (LastEvent), which makes the history complete after a crash between a
compare-and-swap and its event object (the registry's module doc).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from jobplane.model import keys
from jobplane.model.states import State


class Event(BaseModel):
    """One event's body, without the `time` and `kind` its writer adds."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="ignore", populate_by_name=True)

    KIND: ClassVar[str]

    @property
    def kind(self) -> str:
        return self.KIND

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class Created(Event):
    KIND: ClassVar[str] = "created"
    state: State
    spec: dict[str, Any]


class Detail(BaseModel):
    """What a transition's event adds to its own fields (Transitioned), by the transition that has more to say."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="ignore")

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Launched(Detail):
    """The VMs recorded for the attempt, and what they cost."""

    instances: list[str]
    instance_type: str
    zone: str | None
    image: str
    market: str
    price: float | None
    price_source: str
    fallback: str | None = None  # why a Spot job's attempt runs on-demand (absent when it does not)

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"fallback"} if self.fallback is None else set())


class Retried(Detail):
    """The claim of an attempt that retries an error: the retries counted so far, this one included."""

    retries: int


class Rejected(Detail):
    """Why the policy or the deployment refuses the spec: each error with its field."""

    errors: list[dict[str, Any]]


class Transitioned(Event):
    """A transition (kind: its target state, in lower case): from, to, the attempt, and why, in prose (reason) and
    as a stable value (cause: a decide.rules Rule or LaunchCause; absent when the writer named none)."""

    source: State = Field(alias="from")
    to: State
    attempt: int
    reason: str | None
    cause: str | None = None

    @property
    def kind(self) -> str:
        return self.to.lower().replace("_", "-")

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude={"cause"} if self.cause is None else set())


class Applied(Event):
    """What the applier did to a job beside a transition (or refused to do), with the action's rule and reason."""

    rule: str
    reason: str


class Terminated(Applied):
    KIND: ClassVar[str] = "terminated"
    instances: list[str]


class StopRequested(Applied):
    KIND: ClassVar[str] = "stop-requested"
    by: str


class Refused(Applied):
    KIND: ClassVar[str] = "refused"
    refused: str | None  # why the safety limits refused it
    instances: list[str]


class IgnoredFact(Event):
    """A fact of the attempt the functions do not act on (it does not parse, or names no instance of it)."""

    KIND: ClassVar[str] = "ignored-fact"
    attempt: int
    key: str
    why: str


class IdleGpu(Event):
    KIND: ClassVar[str] = "idle-gpu"
    attempt: int
    reason: str
    action: str  # the policy's idle_gpu.action: warn or stop
    threshold: float
    window: int


class SpotWarning(Event):
    """EC2's two-minute Spot interruption warning for one of the job's VMs (also kept in job.json's notices)."""

    KIND: ClassVar[str] = "spot-warning"
    instance_id: str
    attempt: int | None
    rank: int | None
    action: str | None  # terminate, stop or hibernate
    received_at: str


class UnreadableRecord(Event):
    """job.json does not parse: noted once per version of it."""

    KIND: ClassVar[str] = "unreadable-record"
    version: str
    problem: str


class LastEvent(BaseModel):
    """The event of the write that made a record (its creation or its last transition), carried in job.json
    until it is surely in the history: its key is fixed before the CAS, so writing it again is harmless."""

    model_config = ConfigDict(defer_build=True, frozen=True)

    stamp: str
    kind: str
    body: dict[str, Any]

    def key(self, job_id: str) -> str:
        return keys.event(job_id, self.stamp, self.kind)


def stamp_after(previous: LastEvent | None, now: datetime) -> str:
    """The new event's stamp, sorting after the previous event's so the history lists in CAS order, even when
    both writes used one `now` (create and claim in one launcher run) or this writer's clock is behind. Two
    writers racing from one record at one `now` must still get different stamps: a writer whose CAS failed takes
    a record bearing its own stamp for its own write landing (Registry._landed), and would go on as the winner."""
    stamp = keys.stamp(now)
    if previous is None or stamp > previous.stamp:
        return stamp
    return previous.stamp + stamp[-4:]  # its random digits: sorts right after the previous one, as unique as it
