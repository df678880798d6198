"""A trial's objective curve, read from its metric chunks incrementally: sweeps/<sweep>/curves/<job>.json keeps the
rank-0 points of the objective read so far and, per attempt, the last chunk read, so a run reads only the chunks
written since the last one (an agent ships one every 10 s: a long trial has thousands, and an early-stop rule
compares every trial's curve on every run). Chunks are create-only, so the cache is a pure function of them: two
runs writing it at once write the same points, and one that writes an older view only makes the next run read a
few chunks again. A trial that has ended and whose last chunk is in is never read again.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, ValidationError

from jobplane.clouds.base import NotFound
from jobplane.model import keys

# After an end that no exit report made (a stop, a cap, a stall), the agent may still ship its last chunk.
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import TERMINAL, State
from jobplane.store.registry import JobNotFound, UnreadableRecord, read_job
from jobplane.store.rooted import RootedStore

LATE_CHUNKS = timedelta(minutes=10)
Curve = tuple[tuple[int, float], ...]


class Cached(BaseModel):
    model_config = ConfigDict(defer_build=True)

    version: int = 1
    metric: str
    points: list[tuple[int, int | None, float]] = []  # (attempt, step, value), in the order printed
    read: dict[int, int] = {}  # attempt -> the last chunk (sequence number) of rank 0 read
    complete: bool = False  # the job has ended and every chunk it will have is read


def read(reg: RootedStore, sweep_id: str, job_id: str, metric: str, now: datetime, *, job: JobRecord | None = None,
         save: bool = True) -> tuple[Curve, float | None]:
    """The trial's curve of `metric` ((step, value) in step order, a step printed again by a later attempt taking
    that attempt's value) and the last value printed. save=False reads without writing the cache (the SDK)."""
    cached = _load(reg, sweep_id, job_id, metric)
    if not cached.complete:
        job = job or _job(reg, job_id)
        if job is not None and job.attempt:
            fresh = _catch_up(reg, cached, job, metric, now)
            if save and fresh != cached:
                reg.put(keys.sweep_curve(sweep_id, job_id), fresh.model_dump_json().encode(), "application/json")
            cached = fresh
    by_step = {step: value for _, step, value in cached.points if step is not None}
    return tuple(sorted(by_step.items())), cached.points[-1][2] if cached.points else None


def _load(reg: RootedStore, sweep_id: str, job_id: str, metric: str) -> Cached:
    with contextlib.suppress(NotFound, ValidationError, ValueError):
        cached = Cached.model_validate_json(reg.get_bytes(keys.sweep_curve(sweep_id, job_id)))
        if cached.metric == metric:
            return cached
    return Cached(metric=metric)  # none yet, or one that does not parse: read the chunks again


def _job(reg: RootedStore, job_id: str) -> JobRecord | None:
    try:
        return read_job(reg, job_id)[0]
    except (JobNotFound, UnreadableRecord):
        return None


def _catch_up(reg: RootedStore, cached: Cached, job: JobRecord, metric: str, now: datetime) -> Cached:
    """Read the chunks of rank 0 written since the cache's last, attempt by attempt up to the job's current."""
    from jobplane.model.metrics import decode  # only a run with a live sweep reads metrics

    complete = job.state in TERMINAL and (job.state in (State.SUCCEEDED, State.FAILED)  # after the exit reports
                                          or now - job.state_since > LATE_CHUNKS)
    points, read = list(cached.points), dict(cached.read)
    for attempt in range(max(read, default=1), job.attempt + 1):
        chunks = sorted((int(node.name.split(".")[0]), k) for k, _, _ in reg.listing(keys.metrics_prefix(
            job.data, attempt, 0)) if (node := keys.parse_node_file(k, "metrics")) and node.name.endswith(".jsonl"))
        for seq, chunk in chunks:
            if seq <= read.get(attempt, -1):
                continue
            with contextlib.suppress(NotFound):
                points += [(attempt, s.step, s.value) for s in decode(reg.get_bytes(chunk), attempt, 0)
                           if s.name == metric]
            read[attempt] = seq
    return Cached(metric=metric, points=points, read=read, complete=complete)
