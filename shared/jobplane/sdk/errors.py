"""The errors the SDK raises on purpose. Each is a JobplaneError whose message is one line a person can act on
(the CLI prints it as `Error: <message>`); what the layers below raise is translated here, once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from jobplane.clouds.base import AccessDenied
from jobplane.model.errors import FieldError
from jobplane.model.states import State
from jobplane.ops import backend, jobs
from jobplane.store.registry import JobExists as _JobExists
from jobplane.store.registry import JobNotFound as _JobNotFound
from jobplane.store.registry import TransitionRefused
from jobplane.sweeps import store


class JobplaneError(Exception):
    """Base of every error the SDK raises on purpose."""


class ConfigurationError(JobplaneError):
    """The registry is not named, or named two contradicting ways: no bucket (`JOBPLANE_BUCKET`), a bucket URL on
    one cloud and `cloud=` the other, an unknown cloud."""


class BackendError(ConfigurationError):
    """The cloud's VM API is not configured: on GCP, no project (`GOOGLE_CLOUD_PROJECT` or the policy's
    `gcp.project`) or no region (`JOBPLANE_REGION`). Only what looks at a job's VMs needs it."""


class JobNotFound(JobplaneError, LookupError):
    """No job has this id: it is neither recorded, nor in queue/, nor rejected."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r}")
        self.job_id = job_id


class SweepNotFound(JobplaneError, LookupError):
    """No sweep has this id; the message says what the id is instead: a spec still in queue/ (`queued`: the
    launcher records it within seconds; `Client.sweep(id, wait=...)` waits), a rejected one (and why), a job, an
    array (`Client.array(id)`, which raises it too, saying "no array")."""

    def __init__(self, sweep_id: str, why: str = "", queued: bool = False, kind: str = "sweep") -> None:
        super().__init__(f"no {kind} {sweep_id!r}" + (f" {why}" if why else ""))
        self.sweep_id, self.queued = sweep_id, queued


class JobExists(JobplaneError):
    """A job with this id exists already: job ids are never reused."""

    def __init__(self, job_id: str, message: str | None = None) -> None:
        super().__init__(message or f"job {job_id!r} already exists: job ids are never reused")
        self.job_id = job_id


class InvalidSpec(JobplaneError, ValueError):
    """The spec cannot be submitted. `errors` has every problem found, each naming its field (`path`, as in
    `inputs.train.uri`) and what is allowed (`message`); `source` is the spec's file, if it came from one."""

    def __init__(self, errors: list[FieldError], source: str | None = None) -> None:
        super().__init__((f"{source}: " if source else "") + "; ".join(map(str, errors)))
        self.errors, self.source = errors, source


class Timeout(JobplaneError, TimeoutError):
    """A wait ended before the job reached its goal; the job goes on. `state` and `reason` are what the job was
    when the wait gave up, after `waited` seconds."""

    def __init__(self, message: str, job_id: str, state: State, reason: str | None, waited: float) -> None:
        super().__init__(message)
        self.job_id, self.state, self.reason, self.waited = job_id, state, reason, waited


class Refused(JobplaneError):
    """What was asked cannot be done as things stand: cancelling a job that has ended (or whose queued spec the
    launcher will reject), submitting under an id that is being submitted or is queued, an `id=` or `owner=`
    the spec contradicts, an artifact that changed while it was downloaded."""


class NotYours(Refused):
    """IAM refused what was asked of a job of another team: a team member's credentials reach only its own team's
    jobs' logs, metrics, checkpoints, artifacts and code, and cancel only its own team's jobs (every team sees every
    job's record: its id, owner, state and spec)."""

    def __init__(self, job_id: str, owner: str) -> None:
        super().__init__(f"job {job_id} belongs to {owner}: your credentials reach only your own team's jobs' logs, "
                         "metrics, checkpoints, artifacts and code, and cancel only your own team's jobs")
        self.job_id, self.owner = job_id, owner


@contextlib.contextmanager
def translated(job_id: str | None = None, owner: str | None = None) -> Iterator[None]:
    """Raise the SDK's errors for the ones the layers below (jobs, registry, backend) raise; a refusal by IAM of a
    job's keys (its owner given) as NotYours."""
    try:
        yield
    except AccessDenied as exc:
        if job_id is not None and owner is not None:
            raise NotYours(job_id, owner) from None
        raise Refused(f"{exc}: your credentials may not do this (another team's, or the control plane's)") from None
    except _JobNotFound as exc:
        raise JobNotFound(exc.job_id) from None
    except store.SweepNotFound as exc:
        raise SweepNotFound(exc.sweep_id, exc.why, exc.queued, exc.kind) from None
    except _JobExists as exc:
        raise JobExists(exc.job_id, str(exc)) from None
    except jobs.SpecInvalid as exc:
        raise InvalidSpec(exc.errors, exc.source) from None
    except jobs.WaitTimedOut as exc:
        raise Timeout(str(exc), exc.view.id, exc.view.state, exc.view.reason, exc.waited) from None
    except (jobs.JobError, TransitionRefused) as exc:
        raise Refused(str(exc)) from None
    except backend.BackendError as exc:
        raise BackendError(str(exc)) from None
