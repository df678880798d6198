"""A job's `after:` (Slurm's --dependency, AWS Batch's dependsOn): whether its attempt may go on, as its dependencies
stand, and what a spec's `after:` names wrongly.

Each entry names a job or an array (or a sweep), as Slurm names its kinds: `ID` or `afterok:ID` (it SUCCEEDED; an
array or a sweep: its record ended COMPLETED, for an array every member SUCCEEDED), `afterany:ID` (it ended, however)
and `afternotok:ID` (it ended otherwise). Pure: the launcher reads each named job's record, or the array's record
(`Dependency`: its state and reason, or missing), and applies the answer: go on (every one met), wait (some not ended
yet: WAITING_CAPACITY, marked under after/<dependency>/ so the run that ends the dependency retries this job at
once), or fail naming the first that can no longer be met. A record that does not parse is waited for, saying so,
within the job's max_wait (the platform team may repair it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobplane.model.errors import FieldError
from jobplane.model.specfields import AFTER_KINDS
from jobplane.model.states import TERMINAL, State

AFTEROK, AFTERANY, AFTERNOTOK = AFTER_KINDS
RECORD_RUNNING, RECORD_COMPLETED = "RUNNING", "COMPLETED"  # an array's (a sweep's) record while live, and its success


@dataclass(frozen=True)
class Entry:
    """One entry of `after:`: the kind (afterok, afterany, afternotok) and the job's or array's id."""

    kind: str
    target: str

    def __str__(self) -> str:
        return self.target if self.kind == AFTEROK else f"{self.kind}:{self.target}"


def entries(after: Sequence[str]) -> list[Entry]:
    """A spec's `after:` as entries: `prep` is afterok:prep (no job id has a colon)."""
    out = []
    for text in after:
        kind, _, target = text.rpartition(":")
        out.append(Entry(kind or AFTEROK, target))
    return out


@dataclass(frozen=True)
class Dependency:
    job_id: str
    state: str | None  # a job's State, or an array's record state (RUNNING, COMPLETED, FAILED, CANCELLED); None: none
    reason: str | None = None
    kind: str = AFTEROK
    array: bool = False  # a record of sweeps/ (an array's, or a sweep's), not a job's
    unreadable: bool = False  # its record does not parse: nothing says how it stands (state None)

    @property
    def ended(self) -> bool:
        if self.state is None:
            return False
        return self.state != RECORD_RUNNING if self.array else self.state in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.state == (RECORD_COMPLETED if self.array else State.SUCCEEDED)

    @property
    def named(self) -> str:
        """'prep', 'array shards', 'afterany:prep'."""
        return ("array " if self.array else "") + str(Entry(self.kind, self.job_id))

    @property
    def standing(self) -> str:
        """How it stands, as a waiting job's reason says: its state, or that its record does not parse."""
        if self.unreadable:
            return f"its {'sweep.json' if self.array else 'job.json'} does not parse"
        return str(self.state)


@dataclass(frozen=True)
class Waiting:
    reason: str  # "waiting for prep (RUNNING)"
    on: tuple[str, ...]  # the dependencies not ended yet


@dataclass(frozen=True)
class Failed:
    reason: str


def gate(dependencies: Sequence[Dependency]) -> Waiting | Failed | None:
    """None: every dependency is met (or there is none)."""
    for dep in dependencies:
        if dep.state is None and not dep.unreadable:
            return Failed(f"dependency {dep.job_id} no longer exists (after)")
        if dep.ended and dep.kind == AFTEROK and not dep.succeeded:
            why = f": {dep.reason}" if dep.reason else ""
            return Failed(f"dependency {dep.named} ended {dep.state}{why} (after)")
        if dep.ended and dep.kind == AFTERNOTOK and dep.succeeded:
            what = "array " if dep.array else ""
            return Failed(f"dependency {what}{dep.job_id} ended {dep.state}: {Entry(dep.kind, dep.job_id)} can never "
                          "be met (after)")
    pending = [dep for dep in dependencies if not dep.ended]
    if not pending:
        return None
    return Waiting(f"waiting for {', '.join(f'{d.named} ({d.standing})' for d in pending)} (after)",
                   tuple(d.job_id for d in pending))


def problems(after: Sequence[str], job_id: str | None, exists: Mapping[str, bool]) -> list[FieldError]:
    """What `after:` names wrongly, each naming its entry (`after[1]`): the job itself, an id named twice, or one that
    is neither a job nor an array (`exists`: whether each id is one, as the caller read it)."""
    errors: list[FieldError] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries(after)):
        if entry.target == job_id:
            errors.append(FieldError(f"after[{i}]", "a job cannot wait for itself"))
        elif entry.target in seen:
            errors.append(FieldError(f"after[{i}]", f"{entry.target!r} is named twice"))
        elif not exists.get(entry.target):
            errors.append(FieldError(f"after[{i}]", f"no job or array {entry.target!r}: submit what this one waits "
                                                    "for first"))
        seen.add(entry.target)
    return errors
