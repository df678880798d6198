"""A sweep's record, sweeps/<id>/sweep.json: the sweep's spec, its trials as proposed, their outcomes, the
early stops and the best trial. One model, read by the reconcile run, the SDK and the dashboard alike.

The record is the sweep's whole state: which trials exist (the trial list only grows, by compare-and-swap, which
is what keeps two overlapping runs from proposing one trial twice or more than max_trials), with which
parameters, and, once a trial's job has ended, its end state and objective (so a later run reads no more of it).
Everything else about a trial is its job's: job.json, its metrics, its cost.

`advanced` is the pure step a reconcile run takes: the record after one plan of jobplane.decide.trials.

An array (a spec with `array:`) is recorded here too, as a sweep whose trials are its members: trial n is member
n - 1, job <id>-<n - 1>, with no parameters; it ends COMPLETED when every member SUCCEEDED, else FAILED.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from jobplane.decide.trials import Plan, TrialView, trial_id
from jobplane.model import keys
from jobplane.model.spec import JobSpec, spec_to_json
from jobplane.model.specfields import HpValue
from jobplane.model.states import TERMINAL, State
from jobplane.model.sweepspec import ARRAY_LABEL, ArraySpec, SweepSpec

FORMAT = 1  # the record's format version
NOT_DROPPED = "NOT_DROPPED"  # counts(): trials (members) the record has not proposed (dropped) yet
ENDED = "ENDED"  # counts(): a trial whose job was not looked at, of the live jobs only, nor seen ended by the record


class SweepState(StrEnum):
    RUNNING = "RUNNING"  # proposing trials until max_trials, and watching them
    COMPLETED = "COMPLETED"  # every trial proposed has ended; `best` names the best one
    CANCELLED = "CANCELLED"  # by its owner: no more trials, the live ones cancelled
    FAILED = "FAILED"  # every trial ended and none reported the objective


class Trial(BaseModel):
    """One proposed trial: job `job_id` (trial_id(sweep, number)). `state` and `objective` are filled in once its
    job has ended (a terminal state never changes, so a later run need not read the job again)."""

    model_config = ConfigDict(defer_build=True, extra="ignore", frozen=True)

    number: int
    job_id: str
    params: dict[str, HpValue]
    proposed_at: datetime
    state: State | None = None  # the job's end state, once it has one
    objective: float | None = None  # a SUCCEEDED trial's final value of the objective metric


class Best(BaseModel):
    """The best trial so far (the sweep's result once it is COMPLETED)."""

    model_config = ConfigDict(defer_build=True, extra="ignore", frozen=True)

    number: int
    job_id: str
    params: dict[str, HpValue]
    objective: float
    artifacts: str  # registry-relative: jobs/<best>/artifacts/model/


class SweepRecord(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore", frozen=True)

    version: int = FORMAT
    id: str
    owner: str
    spec: JobSpec  # as submitted, its sweep: section included; every trial's template
    state: SweepState = SweepState.RUNNING
    created_at: datetime
    updated_at: datetime
    trials: list[Trial] = []
    stopped: dict[str, str] = {}  # job id -> why the early-stop rule stopped it
    best: Best | None = None
    reason: str | None = None  # why it ended
    write: str | None = None  # a random token per write: after a refused CAS, the writer knows its own record

    @classmethod
    def new(cls, sweep_id: str, spec: JobSpec, now: datetime) -> SweepRecord:
        return cls(id=sweep_id, owner=spec.owner, spec=spec.model_copy(update={"id": sweep_id}), created_at=now,
                   updated_at=now)

    @property
    def sweep(self) -> SweepSpec:
        if self.spec.sweep is None:  # an array's record
            raise ValueError(f"sweep {self.id}: its spec has no sweep: section")
        return self.spec.sweep

    @property
    def section(self) -> SweepSpec | ArraySpec:
        """What the plan runs: the sweep: section, or an array's array: section."""
        if (found := self.spec.fan_out) is None:  # the launcher records only specs with one
            raise ValueError(f"sweep {self.id}: its spec has neither a sweep: nor an array: section")
        return found

    @property
    def is_array(self) -> bool:
        return self.spec.sweep is None and self.spec.array is not None

    @property
    def label(self) -> str:
        """The label naming this record's id on each of its jobs: `sweep`, or an array's `array`."""
        return ARRAY_LABEL if self.is_array else "sweep"

    @property
    def live(self) -> bool:
        return self.state == SweepState.RUNNING

    @property
    def size(self) -> int:
        """Trials in all: an array's size (its members), a sweep's max_trials (or its grid's size)."""
        return self.section.trial_count

    def counts(self, seen: Mapping[str, str | None], unseen: str = State.QUEUED) -> dict[str, int]:
        """Its trials (an array's members) by state, in State's order, then those not dropped yet (NOT_DROPPED). A
        trial's state is its job's as `seen` gives it (None: its drop waits for the launcher, QUEUED), else the end
        the record saw, else `unseen` (what a trial whose job was not looked at is: QUEUED, or ENDED when only live
        jobs were)."""
        found = Counter(str(seen.get(t.job_id) or State.QUEUED) if t.job_id in seen else str(t.state or unseen)
                        for t in self.trials)
        order = [*State, ENDED]
        counts = {state: found[state] for state in sorted(found, key=lambda s: order.index(s) if s in order else 99)}
        return {**counts, NOT_DROPPED: self.size - len(self.trials)} if len(self.trials) < self.size else counts

    def trial(self, job_id: str) -> Trial | None:
        return next((t for t in self.trials if t.job_id == job_id), None)

    def trial_doc(self, trial: Trial) -> dict[str, Any]:
        """The trial's job spec, as its queue drop holds it: the template without `sweep:`, its own id, the
        template's hyperparameters with the trial's over them, labelled with the sweep and the trial's number.
        An array's member: the spec with its index added to `array:`, labelled with the array."""
        doc = {k: v for k, v in spec_to_json(self.spec).items() if k != "sweep"}
        doc["id"] = trial.job_id
        if self.is_array:
            doc["array"] = {**doc["array"], "index": trial.number - 1}
            doc["labels"] = {**doc.get("labels", {}), ARRAY_LABEL: self.id}
            return doc
        doc["hyperparameters"] = {**doc.get("hyperparameters", {}), **trial.params}
        doc["labels"] = {**doc.get("labels", {}), "sweep": self.id, "trial": str(trial.number)}
        return doc

    def advanced(self, views: list[TrialView], plan: Plan, now: datetime) -> SweepRecord:
        """The record after this plan (self when nothing changes): its proposals appended, the trials seen to end
        with their outcome, the new early stops, the best so far, and the end once the plan says done."""
        trials = [self._seen(t, views) for t in self.trials]
        for n, proposal in enumerate(plan.propose, start=len(trials) + 1):
            if proposal.number != n:
                raise ValueError(f"sweep {self.id}: trial {proposal.number} proposed where {n} comes next")
            trials.append(Trial(number=n, job_id=trial_id(self.id, n, array=self.is_array), params=proposal.params,
                                proposed_at=now))
        ended = {t.job_id for t in trials if t.state is not None}
        stopped = {**self.stopped, **{s.job_id: s.reason for s in plan.stop
                                      if s.job_id not in self.stopped and s.job_id not in ended}}
        best = self._best(plan.best) if plan.best is not None else self.best
        fields: dict[str, Any] = {"trials": trials, "stopped": stopped, "best": best}
        if plan.done and not plan.propose and self.is_array:
            fields.update(state=SweepState.COMPLETED if all(t.state == State.SUCCEEDED for t in trials)
                          else SweepState.FAILED, reason=ending(trials, {}, None, None))
        elif plan.done and not plan.propose:
            fields.update(state=SweepState.COMPLETED if best else SweepState.FAILED,
                          reason=ending(trials, stopped, best, self.sweep.objective.metric))
        new = self.model_copy(update=fields)
        return new if new == self else new.model_copy(update={"updated_at": now})

    def _seen(self, trial: Trial, views: list[TrialView]) -> Trial:
        view = next((v for v in views if v.job_id == trial.job_id), None)
        if trial.state is not None or view is None or view.state not in TERMINAL:
            return trial
        return trial.model_copy(update={"state": view.state, "objective": view.final})

    def _best(self, view: TrialView) -> Best | None:
        if view.final is None:
            return self.best
        return Best(number=view.number, job_id=view.job_id, params=dict(view.params), objective=view.final,
                    artifacts=keys.artifacts_prefix(view.data or keys.JobData(view.job_id, self.owner)) + "model/")


def ending(trials: list[Trial], stopped: dict[str, str], best: Best | None, metric: str | None) -> str:
    """Why a sweep ended: "12 trials: 9 SUCCEEDED, 2 stopped early, 1 FAILED; best s-t007 (val:loss 0.12)"; an
    array (metric None): "10 members: 9 SUCCEEDED, 1 FAILED"."""
    states = Counter("stopped early" if t.job_id in stopped and t.state == State.CANCELLED else str(t.state)
                     for t in trials)
    counts = ", ".join(f"{n} {what}" for what, n in sorted(states.items(), key=lambda kv: (-kv[1], kv[0])))
    if metric is None:
        return f"{len(trials)} members: {counts}"
    result = f"best {best.job_id} ({metric} {best.objective:.6g})" if best else f"no trial reported {metric}"
    return f"{len(trials)} trials: {counts}; {result}"
