"""What a job's credentials are decided on (jobplane.decide.vend), read from its job.json without the record's models.

Every run of a vend function reads one record for one decision: its id, state, attempt, instances and data layout,
and its spec's owner and `code:`. Reading them with the plain checks of jobplane.model.checked spares the function
pydantic and the spec's models at each cold start. The fields read are checked as strictly as JobRecord checks them,
and the id must be the job asked about; the other fields are the control plane's to read (it records a job.json it
cannot parse as an unreadable-record event on the job).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jobplane.model.checked import build, checked, items, nested, one_of, optional, text, whole
from jobplane.model.errors import FieldError, SpecError
from jobplane.model.keys import DATA_LAYOUT, JOB_ID_PATTERN, LABEL_KEY, JobData
from jobplane.model.secrets import MAX_PER_JOB, NAME_PATTERN, unique
from jobplane.model.states import State

_STATE = one_of(*State)


def _state(value: Any, path: str) -> State:
    return State(_STATE(value, path))


def _owner(value: Any, path: str) -> str:
    if not isinstance(value, str) or not re.match(LABEL_KEY, value):
        raise ValueError(f"should be an owner (lowercase letter, then a-z 0-9 _ -, at most 63), got {value!r}")
    return value


def _secret(value: Any, path: str) -> str:
    if not isinstance(value, str) or not re.match(NAME_PATTERN, value):
        raise ValueError(f"should be a secret name, got {value!r}")
    return value


def _secrets(value: Any, path: str) -> tuple[str, ...]:
    """spec.secrets as stored (variable -> {name, file}): the names only."""
    if not isinstance(value, dict) or len(value) > MAX_PER_JOB:
        raise ValueError(f"should be a mapping of at most {MAX_PER_JOB} secrets")
    return tuple(_secret(ref.get("name") if isinstance(ref, dict) else ref, path) for ref in value.values())


def _registry_auth(value: Any, path: str) -> str | None:
    """spec.container as stored: its registry_auth secret's name, if any."""
    auth = value.get("registry_auth") if isinstance(value, dict) else None
    return None if auth is None else _secret(auth, path)


@dataclass(frozen=True)
class SpecFacts:
    owner: str = checked(_owner, "default")
    code: str | None = checked(optional(text(4096)), None)
    secrets: tuple[str, ...] = checked(_secrets, ())
    container: str | None = checked(_registry_auth, None)  # the container's registry_auth, nothing else of it

    @property
    def secret_names(self) -> tuple[str, ...]:
        return unique((*self.secrets, *([self.container] if self.container else [])))


@dataclass(frozen=True)
class JobFacts:
    id: str = checked(text(256))
    state: State = checked(_state)
    spec: SpecFacts = checked(nested(SpecFacts, ignore_unknown=True))
    attempt: int = checked(whole(0, 1_000_000), 0)
    instances: list[str] = checked(items(text(256), 10_000), factory=list)
    layout: int = checked(whole(1, 1000), 1)

    @property
    def data(self) -> JobData:
        """Where the job's data is (JobRecord.data)."""
        return JobData(self.id, self.spec.owner if self.layout >= DATA_LAYOUT else None)


def parse_facts(data: bytes, job_id: str) -> JobFacts:
    """The facts of job.json's bytes; ValueError (SpecError naming the fields) when they do not parse or the record
    is another job's."""
    facts = build(JobFacts, json.loads(data), ignore_unknown=True)
    if facts.id != job_id or not re.match(JOB_ID_PATTERN, facts.id):
        raise SpecError([FieldError("id", f"{facts.id!r} is not job {job_id}")])
    return facts
