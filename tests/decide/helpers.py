"""Builders for plain snapshot data: records, markers, beats, instances at ages relative to NOW."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from jobplane.clouds.base import Instance
from jobplane.decide.model import ExitReport, Limits, PreemptedMark, Snapshot
from jobplane.model import keys
from jobplane.model.jobrecord import JobRecord
from jobplane.model.listings import ActiveMarker, Beat
from jobplane.model.policy import Policy, SafetyPolicy
from jobplane.model.spec import JobSpec
from jobplane.model.states import State

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
# stall 30m, boot 15m, orphan grace 10m, stop grace 10m, ceiling 7d (the defaults), blast radius 20 / 50%
POLICY = Policy()


@dataclass(frozen=True)
class Candidate:
    """A row of a candidates table: does the check read this job's job.json, from the listings alone?"""

    name: str
    snap: Snapshot
    read: bool
    policy: Policy = POLICY


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def policy(**safety: Any) -> Policy:
    return Policy(safety=SafetyPolicy(**safety))


def record(job: str = "j", state: State = State.RUNNING, attempt: int = 1, *, nodes: int = 1, spot: bool = False,
           since: float = 600, launched: float | None = 900, instances: list[str] | None = None, restarts: int = 0,
           created: float = 3600, **spec: Any) -> JobRecord:
    return JobRecord(
        id=job, spec=JobSpec(id=job, run="python3 train.py", instance_type="g5.xlarge", num_nodes=nodes, spot=spot,
                             **spec),
        state=state, attempt=attempt, restarts=restarts, created_at=ago(created), updated_at=ago(since),
        state_since=ago(since), launched_at=ago(launched) if launched is not None else None,
        instances=[f"i-{job}-{attempt}-{r}" for r in range(nodes)] if instances is None else instances,
        layout=keys.DATA_LAYOUT,  # as the registry creates a record now: its data under teams/<owner>/<id>/
    )


def marker(job: str = "j", state: State = State.RUNNING, attempt: int = 1, since: float = 600,
           limits: Limits | None = None) -> ActiveMarker:
    """A live job's marker; a RUNNING one's name may carry its attempt's limits."""
    return ActiveMarker(job, state, attempt, ago(since), limits)


def inst(job: str | None = "j", attempt: int | None = 1, rank: int = 0, *, age: float = 900, state: str = "running",
         managed: bool = True, protected: bool = False, iid: str | None = None) -> Instance:
    return Instance(id=iid or f"i-{job}-{attempt}-{rank}", state=state, launched_at=ago(age), managed=managed,
                    job_id=job, attempt=attempt, rank=rank, protected=protected)


def beats(job: str = "j", attempt: int = 1, ranks: int = 1, *, hb: float = 10, out: float | None = 20) -> list[Beat]:
    got = [Beat(job, attempt, r, False, ago(hb)) for r in range(ranks)]
    return got + ([Beat(job, attempt, 0, True, ago(out))] if out is not None else [])


def limits(job: str = "j", attempt: int = 1, nodes: int = 1, stall: int = 1800, cap: int = 86400) -> Limits:
    return Limits(job, attempt, nodes, stall, cap)


def healthy(job: str = "j", nodes: int = 1, attempt: int = 1, **limit: int) -> dict[str, Any]:
    """Listings of one healthy RUNNING job (as keyword parts of a Snapshot): its marker carries its limits
    (`limit`: stall, cap)."""
    return {
        "active": {job: (marker(job, attempt=attempt, limits=limits(job, attempt, nodes, **limit)),)},
        "beats": tuple(beats(job, attempt, nodes)),
        "instances": tuple(inst(job, attempt, r) for r in range(nodes)),
    }


def unmarked(parts: dict[str, Any]) -> dict[str, Any]:
    """The same listings with the RUNNING markers as written before they carried their limits."""
    return {**parts, "active": {job: tuple(replace(m, limits=None) for m in found)
                                for job, found in parts["active"].items()}}


def report(rank: int, code: int, reason: str = "exit", error: str | None = None, *, job: str = "j", attempt: int = 1,
           instance_id: str | None = None, **more: Any) -> ExitReport:
    """An exit report as the agent of that rank's instance (named as `record` and `inst` name it) wrote it."""
    return ExitReport(rank, code, reason, error, instance_id=instance_id or f"i-{job}-{attempt}-{rank}", **more)


def snapshot(parts: dict[str, Any] | None = None, *, records: Sequence[JobRecord] = (),
             exits: dict[str, list[ExitReport]] | None = None, preempted: Sequence[PreemptedMark] = (),
             **over: Any) -> Snapshot:
    fields = {**(parts or {}), **over}
    return Snapshot(
        **fields, records={r.id: r for r in records},
        exits={k: tuple(v) for k, v in (exits or {}).items()},
        preempted={m.job_id: m for m in preempted},
    )
