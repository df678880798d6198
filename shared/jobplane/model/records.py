"""The records agents and functions exchange through the bucket: one model per object, used by writer and
reader alike (docs/architecture.md has the layout).

Every record carries `version` (absent in records written before it existed: read as 1). Readers ignore
fields they do not know, so a newer writer may add some; a record that does not parse (bad JSON, a
missing or mistyped field, a version this code does not know) raises RecordError naming the field. The
functions record such a record as an event on its job and ignore it: a bad object in the bucket must
never crash-loop a function.

These objects come from VMs, which all share one role that may write any job's facts: the functions
accept an exit report or a preempted marker only when it names an instance of the job's current attempt
(jobplane.decide.model.attempt_instances).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobplane.model.states import HOLD_BY as HOLD_BY  # a stop request's `by`: in states.py, free of pydantic
from jobplane.model.states import StopBy as StopBy

VERSION: Final = 1
# The most a function reads of one object an agent or a bootstrap wrote (jobplane.control.facts): any VM of a job may
# write its job's keys, and one check serves every job. Their writers stay far under it: an exit report's texts are
# cut to MAX_TEXT characters (at most 6 bytes each in JSON, a control character's escape), a boot failure's too.
MAX_FACT_BYTES: Final = 64 << 10
MAX_TEXT: Final = 4096
ExitReason = Literal["exit", "preempted", "stopped", "early-stop"]


class RecordError(ValueError):
    """A record that does not parse; the message names the record and the field."""


class Record(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="ignore")

    what: ClassVar[str] = "record"  # overridden per model: how messages name it
    version: Literal[1] = VERSION

    def body(self) -> dict[str, Any]:
        """The JSON object to write (Registry.put_json)."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def parse(cls, data: bytes | str) -> Self:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise RecordError(f"{cls.what}: {_first_problem(exc)}") from None


def _first_problem(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if first["type"] == "json_invalid":
        return f"not valid JSON: {first['msg']}"
    return (f"field '{where}': {first['msg']}" if where else first["msg"]) + more


class ExitReport(Record):
    """attempts/<n>/nodes/<rank>/exit.json: how one node's run ended (the agent writes it last)."""

    what: ClassVar[str] = "exit report"
    code: int | None = None  # None: the node stood down before running anything (the job had moved on)
    reason: ExitReason = "exit"  # early-stop: a stop_on rule matched
    instance_id: str = Field(min_length=1)  # the VM that wrote it: checked against the attempt's instances
    started_at: datetime | None = None
    ended_at: datetime | None = None
    error: str | None = None  # what went wrong (requirements.txt, the agent's own failure, the stop_on match)
    stopped_by: str | None = None  # reason "stopped": the stop request's `by`
    stop_reason: str | None = None
    notice: dict[str, Any] | None = None  # the Spot notice, when preempted


class PreemptedMarker(Record):
    """preempted-jobs/<id>: an attempt lost its Spot capacity (the agent saw the notice, or the check
    found the instance gone). Rerun relaunches the job, or fails it when no restarts are left."""

    what: ClassVar[str] = "preempted marker"
    attempt: int = Field(ge=1)
    instance_id: str | None = None  # the agent's VM, or the rank the check found gone; None: a re-mark
    rank: int | None = Field(None, ge=0)
    by: Literal["agent", "sweeper"] = "agent"  # "sweeper": the check (the function's name)
    notice: dict[str, Any] | None = None






class StopRequest(Record):
    """jobs/<id>/control/stop: asks every agent of the job to checkpoint and stop."""

    what: ClassVar[str] = "stop request"
    time: datetime
    by: StopBy  # the agent copies it into its exit report
    reason: str | None = None


class IdleWatch(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="ignore")

    window: float = Field(gt=0)  # seconds
    threshold: float = Field(ge=0, le=100)  # percent


class ClusterFile(Record):
    """attempts/<n>/cluster.json: the attempt's nodes, written by the launcher before agents need it."""

    what: ClassVar[str] = "cluster.json"
    job_id: str
    attempt: int = Field(ge=1)
    hosts: list[str] = Field(min_length=1)  # private addresses, by rank
    instances: list[str] = Field(default_factory=list)  # instance ids, by rank
    master_addr: str
    master_port: int = Field(29500, gt=0, lt=65536)
    num_nodes: int = Field(ge=1)
    instance_type: str | None = None
    zone: str | None = None
    idle_gpu: IdleWatch | None = None  # present when the policy watches idle GPUs


class Heartbeat(Record):
    """heartbeats/<id>/<n>/<rank>: its LastModified is the liveness; the body is for people and tools."""

    what: ClassVar[str] = "heartbeat"
    time: datetime
    instance_id: str
    rank: int
    attempt: int
    phase: str
    last_output_at: datetime | None = None
    gpu_util: float | None = None
    step: int | None = None


class OutputMark(Record):
    """heartbeats/<id>/<n>/<rank>.output: rewritten only when the user process printed something new."""

    what: ClassVar[str] = "output mark"
    time: datetime
    step: int | None = None


class IdleMark(Record):
    """heartbeats/<id>/<n>/<rank>.idle: this rank's mean GPU use over the window was under the threshold."""

    what: ClassVar[str] = "idle mark"
    time: datetime
    mean_gpu_util: float
    window: float
    threshold: float


class BootFailure(Record):
    """attempts/<n>/boot-failure.json: why a VM's bootstrap could not start the agent. Written by the
    bootstrap's standard-library Python (jobplane.boot.bootstrap.INSTALL), which builds the same fields."""

    what: ClassVar[str] = "boot failure"
    message: str = Field(min_length=1)
    python: str | None = None
    host: str | None = None
    time: float | None = None  # seconds since the epoch, as the bootstrap's time.time()
