"""A sweep, as a handle: its state, its trials (best first) with their parameters, objective, state and cost, its
best trial, its total cost, cancelling it. Its trials are jobs: `client.get(trial.job_id)` for the rest. An array
(`client.array(id)`) is the same handle: its trials are its members, by index, with no parameters or objective."""

from __future__ import annotations

import time
from datetime import datetime

from jobplane.clouds.base import AccessDenied
from jobplane.ops import cancels
from jobplane.sdk.connection import Connection
from jobplane.sdk.errors import translated
from jobplane.sweeps import ops
from jobplane.sweeps.record import Best, SweepRecord, SweepState
from jobplane.views import cost

TrialRow = ops.TrialRow


class Sweep:
    """`client.sweep("s")`. `record` is sweeps/<id>/sweep.json as last read (refresh() reads it again)."""

    def __init__(self, connection: Connection, record: SweepRecord) -> None:
        self._connection, self._record = connection, record

    @property
    def id(self) -> str:
        """The sweep's id: its trials are jobs `<id>-t001`, `<id>-t002`, ..."""
        return self._record.id

    @property
    def record(self) -> SweepRecord:
        """The sweep's record: spec (with its sweep: section), state, trials as proposed, early stops, best."""
        return self._record

    @property
    def state(self) -> SweepState:
        """RUNNING, then COMPLETED (or FAILED: no trial reported the objective), or CANCELLED; as last read."""
        return self._record.state

    @property
    def best(self) -> Best | None:
        """The best trial so far (the sweep's result once COMPLETED): `.job_id`, `.params`, `.objective`,
        `.artifacts` (its model's key, teams/<owner>/<id>/artifacts/model/)."""
        return self._record.best

    def refresh(self) -> Sweep:
        """Read the record again; returns the sweep."""
        with translated():
            self._record = ops.records_one(self._connection.registry, self.id, array=self._record.is_array)
        return self

    def describe(self, now: datetime | None = None) -> ops.SweepDetail:
        """The record read again with every trial's job: `.trials` (TrialRow: number, job_id, params, state,
        objective, final, cost, reason; best first), `.cost` (their estimated cost summed), `.live`."""
        with translated():
            detail = ops.describe(self._connection.registry, self.id, now)
        self._record = detail.record
        return detail

    def trials(self) -> list[TrialRow]:
        """Its trials, best first (describe().trials)."""
        return self.describe().trials

    def cost(self, now: datetime | None = None) -> cost.Cost:
        """The trials' estimated cost, summed (instance time at the prices recorded at launch)."""
        return self.describe(now).cost

    def cancel(self, force: bool = False, *, wait: float = cancels.REQUEST_WAIT_S) -> Sweep:
        """No more trials; the live ones are cancelled as `Job.cancel()` cancels a job (force: their VMs terminated
        at once). Refused if it had ended. A team member asks the functions, as Job.cancel() does, and waits up to
        `wait` seconds for them (NotYours for another team's)."""
        registry = self._connection.registry
        with translated(self.id, self._record.owner):
            try:
                self._record = ops.cancel(registry, self.id, self._connection.compute, force=force)
            except AccessDenied:  # not the platform team: ask the functions
                cancels.ask(registry, self._record.owner, self.id, force=force)
                deadline = time.monotonic() + wait
                while self._record.live and time.monotonic() < deadline:
                    time.sleep(1.0)
                    self._record = ops.records_one(registry, self.id, array=self._record.is_array)
        return self

    def __repr__(self) -> str:
        kind, what = ("Array", "members") if self._record.is_array else ("Sweep", "trials")
        return f"{kind}({self.id!r}, {self.state}, {len(self._record.trials)} {what})"
