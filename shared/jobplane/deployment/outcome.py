"""What a run did with each thing it took up: one Outcome for the launcher (a queue entry, a capacity wait), the
reconcilers (an action of the check, rerun or the uptime cap, and a sweep's early stop) and the sweeps' reconcile (a
step of one sweep). Each run names its results in its own Result enum, whose value is what a function answers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the launcher's cold start loads this module, and none of the reconcilers' decisions
    from jobplane.decide.model import Action


@dataclass(frozen=True)
class Outcome:
    subject: str  # what it took up: a queue key or a job id (launcher), a job or VMs (an action), a sweep's id
    result: StrEnum
    detail: str | None = None  # why: the job's reason, a refusal's, a skip's, the error; a trial's parameters
    trial: str | None = None  # the sweep's trial (its job id) the step concerned
    action: Action | None = None  # the reconciler's action, whole: its rule, reason and effects

    @classmethod
    def of(cls, action: Action, result: StrEnum, detail: str | None = None) -> Outcome:
        """A reconciler's action and what became of it: its subject is its job, or the VMs of a jobless one."""
        return cls(action.job_id or ", ".join(action.terminate) or "-", result, detail, action=action)

    @property
    def acted(self) -> Action:
        """The reconciler's action (an outcome of a reconciler's run has one)."""
        if self.action is None:
            raise ValueError(f"{self.subject}: not the outcome of an action")
        return self.action
