"""The sweep operations the SDK offers (jobplane.sdk.sweep; the CLI is built on that): list sweeps, describe one
(its trials with their parameters, objective, state and estimated cost, best first), cancel one. An array's
record is found, described (its members by index) and cancelled by the same functions; sweeps are listed alone.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from jobplane.clouds.base import Compute
from jobplane.model.clock import utcnow
from jobplane.model.specfields import HpValue
from jobplane.model.states import TERMINAL, State
from jobplane.ops import jobs, queue
from jobplane.store.registry import JobNotFound, Registry, UnreadableRecord
from jobplane.sweeps import curves, run, store
from jobplane.sweeps.record import SweepRecord, SweepState, Trial
from jobplane.views import cost


class SweepEnded(jobs.JobError):
    """A cancel of a sweep that has ended."""


@dataclass(frozen=True)
class TrialRow:
    """One trial as `jobplane sweep describe` shows it. `state` None: its drop waits for the launcher. `objective`:
    the final value of a SUCCEEDED trial, else the latest one printed (None before any)."""

    number: int
    job_id: str
    params: dict[str, HpValue]
    state: State | None
    objective: float | None
    final: bool  # objective is the trial's result (it SUCCEEDED), not a value on the way
    cost: cost.Cost
    reason: str | None  # how its job ended, or why it is where it is (an early stop's rule and values)


@dataclass(frozen=True)
class SweepDetail:
    record: SweepRecord
    trials: list[TrialRow]  # best first: finished by objective and goal, then the others by number

    @property
    def cost(self) -> cost.Cost:
        """The trials' estimated cost, summed (jobplane.views.cost)."""
        return sum((t.cost for t in self.trials), cost.Cost())

    @property
    def live(self) -> int:
        """Trials not ended: queued (no job yet) or live."""
        return sum(1 for t in self.trials if t.state is None or t.state not in TERMINAL)

    @property
    def counts(self) -> dict[str, int]:
        """Its trials (an array's members) by state, those not dropped yet too (SweepRecord.counts)."""
        return self.record.counts({t.job_id: t.state for t in self.trials})


def records(reg: Registry, include_finished: bool = False, *, arrays: bool = False) -> list[SweepRecord]:
    """The sweeps with work left (one listing of active-sweeps/), or every sweep; by id. Arrays are left out (with
    arrays, they are the ones given, and a record that does not parse is passed over: `ls` and `queue` show the
    others, and the sweeper's runs report it)."""
    found = []
    skipped = (store.SweepNotFound, store.UnreadableSweep) if arrays else (store.SweepNotFound,)
    for sweep_id in store.all_ids(reg) if include_finished else store.live(reg):
        with contextlib.suppress(*skipped):
            if (record := store.get(reg, sweep_id)[0]).is_array == arrays:
                found.append(record)
    return found


def array_waits(reg: Registry, owner: str | None = None) -> list[queue.Standing]:
    """The members each live array (or one owner's) has not dropped yet, one row an array (`jobplane queue`): they
    are no jobs yet, so no line holds them; the array drops the next as each member ends, at most max_parallel live."""
    policy, out = reg.policy(), []
    for record in records(reg, arrays=True):
        spec, left = record.spec, record.size - len(record.trials)
        if left <= 0 or owner not in (None, record.owner):
            continue
        parallel = record.section.parallel
        out.append(queue.Standing(
            record.id, record.owner, None, policy.priority(spec), spec.num_nodes, record.created_at,
            f"array: {left} of {record.size} members not dropped yet; it drops the next as one ends, at most "
            f"{parallel} at once" + (" (array.max_parallel)" if spec.array and spec.array.max_parallel else ""),
            policy.priority_class(policy.priority(spec)), record.size, left))
    return out


def records_one(reg: Registry, sweep_id: str, *, array: bool = False) -> SweepRecord:
    """The sweep's record (with array, the array's); SweepNotFound when the id is the other kind's, or none."""
    return _of_kind(store.get(reg, sweep_id)[0], array)


def _of_kind(record: SweepRecord, array: bool) -> SweepRecord:
    if record.is_array != array:
        raise store.SweepNotFound(record.id, f"({record.id} is {'a sweep' if array else 'an array'})",
                                  kind=_kind(array))
    return record


def _kind(array: bool) -> str:
    return "array" if array else "sweep"


def _get(reg: Registry, sweep_id: str) -> SweepRecord | None:
    try:
        return store.get(reg, sweep_id)[0]
    except store.SweepNotFound:
        return None


def find(reg: Registry, sweep_id: str, wait: float = 0, interval: float = 1.0, *, array: bool = False,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> SweepRecord:
    """The sweep's record (with array, the array's). A sweep just submitted is a drop in queue/ until the launcher
    records it (seconds): it is waited for up to `wait` seconds. SweepNotFound otherwise, saying why: its spec still
    in queue/ (`queued`), rejected (and why), a job's id, the other kind's, or nothing of that id."""
    deadline = clock() + wait
    while True:
        if (record := _get(reg, sweep_id)) is not None:
            return _of_kind(record, array)
        why, queued = _why_not(reg, sweep_id, array)
        if not why and (record := _get(reg, sweep_id)) is not None:  # a drop recorded and deleted between the reads
            return _of_kind(record, array)
        left = deadline - clock()
        if not queued or left <= 0:
            raise store.SweepNotFound(sweep_id, why, queued, kind=_kind(array))
        sleep(min(interval, left))


def _why_not(reg: Registry, sweep_id: str, array: bool) -> tuple[str, bool]:
    """What the id is, if not a record's, and whether it is a drop the launcher may still make a sweep (an array)."""
    try:
        view = jobs.find(reg, sweep_id)
    except JobNotFound:
        return "", False
    fans_out = view.spec is None or (view.spec.array is not None if array else view.spec.sweep is not None)
    if view.drop is not None and fans_out:
        return "yet: its spec is still in queue/, and the launcher records it within seconds", True
    if view.state == State.INVALID:
        return f"(its spec was rejected: {view.reason})", False
    return f"({sweep_id} is a job, not {'an array' if array else 'a sweep'})", False


def describe(reg: Registry, sweep_id: str, now: datetime | None = None) -> SweepDetail:
    """The sweep and each trial's job: one GET of job.json per trial, and the metrics of the trials still live."""
    now = now or utcnow()
    record = store.get(reg, sweep_id)[0]
    rows = [_row(reg, record, trial, now) for trial in record.trials]
    if record.is_array:
        return SweepDetail(record, rows)  # by index
    sign = -1 if record.sweep.objective.goal == "maximize" else 1
    rows.sort(key=lambda r: (not r.final or r.objective is None or math.isnan(r.objective),
                             sign * r.objective if r.final and r.objective is not None else 0.0, r.number))
    return SweepDetail(record, rows)


def _row(reg: Registry, record: SweepRecord, trial: Trial, now: datetime) -> TrialRow:
    try:
        job = reg.job(trial.job_id)
        if not run.is_member(record, job):
            raise JobNotFound(trial.job_id)  # another owner's job under the id: nothing of it is this sweep's to show
    except (JobNotFound, UnreadableRecord):  # its drop waits for the launcher (or its record is the sweeper's problem)
        return TrialRow(trial.number, trial.job_id, trial.params, trial.state, trial.objective,
                        trial.state == State.SUCCEEDED, cost.Cost(), None)
    objective = trial.objective if trial.state == State.SUCCEEDED or record.is_array else \
        curves.read(reg, record.id, trial.job_id, record.sweep.objective.metric, now, job=job, save=False)[1]
    return TrialRow(trial.number, trial.job_id, trial.params, job.state, objective, job.state == State.SUCCEEDED,
                    cost.job_cost(job, now), job.reason)


def cancel(reg: Registry, sweep_id: str, compute: Callable[[], Compute] | None,
           now: datetime | None = None, *, force: bool = False, by: str | None = None) -> SweepRecord:
    """Cancel the sweep (or array): CANCELLED by compare-and-swap (no run proposes a trial after it), then every
    trial that has not ended is cancelled as `jobplane cancel` cancels a job (force: its VMs terminated at once).
    SweepEnded if it had ended already. by: the team whose member asked (jobplane.control.cancels)."""
    now = now or utcnow()

    def cancelled(current: SweepRecord) -> SweepRecord:
        if not current.live:
            raise SweepEnded(f"{_kind(current.is_array)} {sweep_id} is already {current.state}" + (f": {current.reason}"
                                                                              if current.reason else ""))
        reason = f"cancelled by a member of {by}" if by else "cancelled by the user"
        return current.model_copy(update={"state": SweepState.CANCELLED, "reason": reason, "updated_at": now})

    record = store.update(reg, sweep_id, cancelled)[0]
    run.finish_cancel(reg, record, compute, now=now, force=force)
    return record
