"""`jobplane secret set|ls|rm` and submit's check that a spec names only secrets its owner has, over the
deployment's secret store (clouds/base.SecretStore: SSM Parameter Store on AWS). Values go in, never out: nothing
here reads one (a job's agent does, with the job's credentials)."""

from __future__ import annotations

from jobplane.clouds.base import SecretStore
from jobplane.model import secrets
from jobplane.model.errors import FieldError
from jobplane.model.secrets import SecretInfo
from jobplane.model.spec import JobSpec
from jobplane.ops.jobs import SpecInvalid

DEFAULT_OWNER = "default"  # a single-team deployment's owner (queue/<id>.yaml)


def _checked(owner: str, name: str) -> None:
    if problem := secrets.name_problem(name):
        raise SpecInvalid(None, [FieldError("name", problem)])
    if not owner or len(owner) > 63:
        raise SpecInvalid(None, [FieldError("owner", f"{owner!r} is not an owner")])


def put(store: SecretStore, owner: str, name: str, value: bytes) -> None:
    """Set (or rotate) a secret: the next attempt of a job naming it reads the new value."""
    _checked(owner, name)
    if problem := secrets.value_problem(value):
        raise SpecInvalid(None, [FieldError("value", problem)])
    store.put(owner, name, value)


def listed(store: SecretStore, owner: str | None = None) -> list[SecretInfo]:
    return store.list(owner)


def remove(store: SecretStore, owner: str, name: str) -> bool:
    _checked(owner, name)
    return store.delete(owner, name)


def unknown(store: SecretStore, spec: JobSpec) -> list[FieldError]:
    """Each field naming a secret its owner does not have (`secrets.<VAR>`, `container.registry_auth`)."""
    if not spec.secret_names:
        return []
    have = {info.name for info in store.list(spec.owner)}
    return [FieldError(field, f"no secret {name!r} of owner {spec.owner!r}: set it with `jobplane secret set {name} "
                              f"--owner {spec.owner}`") for field, name in secrets.named(spec) if name not in have]
