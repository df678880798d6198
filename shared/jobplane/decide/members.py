"""Who makes a sweep's trials and an array's members: the control plane alone (issue 57). Pure: a drop's spec and
what the registry holds of the sweep or array its id names in, the spec to record or why the drop is refused out.

A drop's owner is the folder it was written to, and IAM lets a team write only its own; but the sweep reconcile
writes its members' drops to that same folder (jobplane.sweeps.run.trial_drop). So a drop that claims membership
(the labels `array`, `sweep` or `trial`, or an `array.index`) is a member only when its sweep's record, which the
functions alone write, is of the drop's owner, lists its id and makes exactly its spec; the record's spec is then
what the launcher records, never the drop's text. A drop that claims none may not take a member id of a sweep or
array that exists either: the member's own drop would then be refused as a duplicate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobplane.model.errors import FieldError
from jobplane.model.sweepspec import ARRAY_LABEL, TRIAL_LABELS

if TYPE_CHECKING:
    from jobplane.model.spec import JobSpec


@dataclass(frozen=True)
class Parent:
    """The sweep or array a drop's id names it a member of (decide.trials.parent_of), as the registry holds it."""

    id: str
    array: bool
    owner: str = ""  # the record's; "" when only its existence was asked (a drop that claims no membership)
    member: JobSpec | None = None  # the spec the record makes for the drop's id; None if it lists no such trial

    @property
    def kind(self) -> str:
        return "array" if self.array else "sweep"


def claims(spec: JobSpec) -> list[str]:
    """The fields by which a spec claims to be a member: an array's index, and the labels jobplane sets on members."""
    index = ["array.index"] if spec.array is not None and spec.array.index is not None else []
    return index + [f"labels.{label}" for label in (ARRAY_LABEL, *TRIAL_LABELS) if label in spec.labels]


def admit(spec: JobSpec, job_id: str, parent: Parent | None) -> JobSpec | list[FieldError]:
    """The spec to record for this drop (the record's, for a member), or the refusal naming each field."""
    claimed = claims(spec)
    if parent is None:
        return [FieldError(field, "set by jobplane on the members it makes of an array or a sweep: submit the array "
                                  "or the sweep, or leave it out") for field in claimed] or spec
    if not claimed:
        return [FieldError("id", f"{job_id!r} is a member id of {parent.kind} {parent.id!r}: jobplane makes its "
                                 "members; pick another id")]
    if parent.member is not None and parent.owner == spec.owner and spec == parent.member:
        return parent.member
    return [FieldError(field, f"{job_id!r} is not a member {parent.kind} {parent.id!r} made: jobplane alone makes "
                              "its members; leave it out") for field in claimed]
