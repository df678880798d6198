"""Secrets: a job's tokens kept in the cloud's secret store per owner, named by the spec, never stored in the bucket.

A spec's `secrets:` maps an environment variable to a secret name of the job's owner (`{HF_TOKEN: hf-token}`), or to
`{name: hf-token, file: true}` (a 0400 file on a tmpfs, its path in the variable); `container.registry_auth` names
one holding `user:token` for a private registry. job.json keeps these names only. Where a value lives is the
cloud adapter's (`clouds/aws_secrets.py`, `clouds/gcp_secrets.py`), under a name carrying the deployment and the
owner (`store_path`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobplane.model.errors import FieldError

# Short, so a session policy naming a job's secrets stays under AWS's 2,048 characters (vending.aws_iam).
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$"
MAX_VALUE = 64 * 1024  # bytes of a value (the bound; above SageMaker's 512 characters a variable)
MAX_PER_JOB = 8  # secrets a job names, registry_auth included: each is one resource in its session policy
REDACTED = b"***"
# (no pydantic here: the functions read SecretInfo through clouds/base; the spec's fields are in model/specfields.py)

@dataclass(frozen=True)
class SecretInfo:
    """What `secret ls` shows: never a value."""

    owner: str
    name: str
    set_at: datetime | None


class SecretMissing(LookupError):
    """No such secret of the owner."""


def name_problem(name: str) -> str | None:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        return f"{name!r} is not a secret name (1-32 of a-z 0-9 -, not starting or ending with -)"
    return None


def value_problem(value: bytes) -> str | None:
    if not value:
        return "the value is empty"
    if len(value) > MAX_VALUE:
        return f"the value is {len(value)} bytes, over {MAX_VALUE} (64 KiB)"
    return None


def deployment_tag(deployment: str) -> str:
    """6 hex of sha256(bucket[/root]): two deployments in one account never share a secret's name."""
    return hashlib.sha256(deployment.encode()).hexdigest()[:6]


def store_path(deployment: str, owner: str, name: str) -> str:
    """jobplane/<deployment tag>/<owner>/<name>: the one name both clouds' stores derive theirs from."""
    return f"jobplane/{deployment_tag(deployment)}/{owner}/{name}"


def named(spec: Any) -> list[tuple[str, str]]:
    """(field, secret name) for every secret a spec reads: `secrets.<VAR>` and `container.registry_auth`."""
    found = [(f"secrets.{var}", ref.name) for var, ref in (getattr(spec, "secrets", None) or {}).items()]
    container = getattr(spec, "container", None)
    if container is not None and container.registry_auth:
        found.append(("container.registry_auth", container.registry_auth))
    return found


def unique(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(names)))


def spec_problems(raw: dict[str, Any]) -> list[FieldError]:
    """A secret's variable is neither reserved nor also in env:; a job names at most MAX_PER_JOB secrets."""
    named, env = raw.get("secrets"), raw.get("env")
    if not isinstance(named, dict):
        return []
    errors = [FieldError(f"secrets.{k}", "names starting with JOBPLANE_ are reserved")
              for k in named if isinstance(k, str) and k.upper().startswith("JOBPLANE_")]
    errors += [FieldError(f"secrets.{k}", f"{k} is in env: too; give it in one of them")
               for k in named if isinstance(env, dict) and k in env]
    container = raw.get("container")
    auth = container.get("registry_auth") if isinstance(container, dict) else None
    if len(named) + (1 if auth else 0) > MAX_PER_JOB:
        errors.append(FieldError("secrets", f"a job reads at most {MAX_PER_JOB} secrets, "
                                            "container.registry_auth included"))
    return errors
