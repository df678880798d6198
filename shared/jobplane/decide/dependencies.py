"""A job's `after:` (Slurm's afterok, AWS Batch's dependsOn): whether its attempt may go on, as its dependencies stand.

Pure: the launcher reads each named job's record (`Dependency`: its state and reason, or missing) and applies the
answer: go on (every one SUCCEEDED), wait (some not ended yet: WAITING_CAPACITY, marked under after/<dependency>/ so
the run that ends the dependency retries this job at once), or fail naming the first that ended otherwise. A record
that does not parse is waited for, saying so, within the job's max_wait (the platform team may repair it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobplane.model.states import TERMINAL, State


@dataclass(frozen=True)
class Dependency:
    job_id: str
    state: State | None  # None: there is no such job (deleted since the submit checked it), or its record is unreadable
    reason: str | None = None
    unreadable: bool = False  # its job.json does not parse: nothing says how it stands

    @property
    def standing(self) -> str:
        return "its job.json does not parse" if self.unreadable else str(self.state)


@dataclass(frozen=True)
class Waiting:
    reason: str  # "waiting for prep (RUNNING)"
    on: tuple[str, ...]  # the dependencies not ended yet


@dataclass(frozen=True)
class Failed:
    reason: str


def gate(dependencies: Sequence[Dependency]) -> Waiting | Failed | None:
    """None: every dependency SUCCEEDED (or there is none)."""
    for dep in dependencies:
        if dep.state is None and not dep.unreadable:
            return Failed(f"dependency {dep.job_id} no longer exists (after)")
        if dep.state in TERMINAL and dep.state != State.SUCCEEDED:
            why = f": {dep.reason}" if dep.reason else ""
            return Failed(f"dependency {dep.job_id} ended {dep.state}{why} (after)")
    pending = [dep for dep in dependencies if dep.state != State.SUCCEEDED]
    if not pending:
        return None
    return Waiting(f"waiting for {', '.join(f'{d.job_id} ({d.standing})' for d in pending)} (after)",
                   tuple(d.job_id for d in pending))
