"""A job's GCS credentials: the vending function's own access token narrowed to the job's keys by a Credential
Access Boundary and exchanged at STS, as google.auth.downscoped does (with the STS URL a setting, so the local
cloud points it at its fake).

The boundary has one rule per role over the registry bucket, each available only on the grant's keys: a
prefix as `resource.name.startsWith(...)`, an object as `resource.name == ...`, and a listing (checked on the
bucket, where resource.name names no object) through the `objectListPrefix` attribute. Two rules, whatever
the scope holds: far from CAB's limit of 10.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobplane.clouds.base import Scope

GOOGLE_STS_URL = "https://sts.googleapis.com/v1/token"
READ_WRITE_ROLE = "roles/storage.objectUser"  # get, list, create, overwrite, delete objects; no IAM
READ_ONLY_ROLE = "roles/storage.objectViewer"
MAX_RULES = 10  # CAB's limit
LIST_PREFIX = "api.getAttribute('storage.googleapis.com/objectListPrefix', '')"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"


@dataclass(frozen=True)
class Downscoped:
    access_token: str
    expires_in: int


def _quoted(text: str) -> str:
    if "'" in text or "\\" in text:  # never from keys.py; refuse rather than escape into CEL
        raise ValueError(f"{text!r} cannot be named in a boundary condition")
    return f"'{text}'"


def condition(bucket: str, prefixes: tuple[str, ...], objects: tuple[str, ...] = ()) -> str:
    """CEL true exactly on these prefixes' objects and listings, and on these objects."""
    objects_of = f"projects/_/buckets/{bucket}/objects/"
    terms = [f"resource.name.startsWith({_quoted(objects_of + p)})" for p in prefixes]
    terms += [f"{LIST_PREFIX}.startsWith({_quoted(p)})" for p in prefixes]
    terms += [f"resource.name == {_quoted(objects_of + o)}" for o in objects]
    return " || ".join(terms)


def boundary(scope: Scope) -> dict[str, Any]:
    """The Credential Access Boundary (STS's `options` JSON) of a grant's scope."""
    resource = f"//storage.googleapis.com/projects/_/buckets/{scope.bucket}"
    rules = []
    for role, prefixes, objects in ((READ_WRITE_ROLE, scope.read_write, scope.read_write_objects),
                                    (READ_ONLY_ROLE, scope.read_only, scope.read_only_objects)):
        if prefixes or objects:
            rules.append({"availableResource": resource, "availablePermissions": [f"inRole:{role}"],
                          "availabilityCondition": {"title": f"job keys ({role.rsplit('.', 1)[-1]})",
                                                    "expression": condition(scope.bucket, prefixes, objects)}})
    if not rules or len(rules) > MAX_RULES:
        raise ValueError(f"a boundary holds 1 to {MAX_RULES} rules, not {len(rules)}")
    return {"accessBoundary": {"accessBoundaryRules": rules}}


def exchange(scope: Scope, source_token: str, sts_url: str = GOOGLE_STS_URL, timeout: float = 10.0) -> Downscoped:
    """STS's token-exchange of source_token for one limited to scope (google.oauth2.sts.Client, the client
    google.auth.downscoped uses). Raises google.auth.exceptions.OAuthError when STS refuses."""
    from google.auth.transport.requests import Request
    from google.oauth2 import sts

    answer: dict[str, Any] = sts.Client(sts_url).exchange_token(  # type: ignore[no-untyped-call]
        Request(), grant_type=TOKEN_EXCHANGE, subject_token=source_token, subject_token_type=ACCESS_TOKEN,
        requested_token_type=ACCESS_TOKEN, additional_options=boundary(scope))
    return Downscoped(str(answer["access_token"]), int(answer.get("expires_in") or 3600))


def own_access_token() -> str:
    """This process's access token (Application Default Credentials: the function's service account)."""
    import google.auth
    from google.auth.transport.requests import Request

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    credentials.refresh(Request())  # type: ignore[no-untyped-call]
    return str(credentials.token)

