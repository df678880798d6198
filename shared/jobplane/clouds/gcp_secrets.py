"""Secrets in GCP Secret Manager, over its REST API (v1) with an authorized session: the platform's or a team
member's credentials, or the vend function's own identity reading a job's secrets for it (a downscoped token covers
Cloud Storage only, so a job's own token cannot be narrowed to some secrets: vending/gcp.py).

One secret per value, `jobplane-<deployment tag>-<owner>_S_<name>` (the owner and the name are lowercase, so `_S_`
never occurs in either and the owner's part is a prefix an IAM condition can hold a team to); labels carry the
deployment, the owner, the name and when it was last set (`secret ls`); each `set` adds a version and destroys the
ones before it (Secret Manager bills each active version), so `latest` is the value.
"""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime
from typing import Any, Protocol

from jobplane.clouds.base import AccessDenied
from jobplane.model.secrets import SecretInfo, SecretMissing, deployment_tag

GOOGLE_SECRETS_URL = "https://secretmanager.googleapis.com"


class Session(Protocol):
    """A requests.Session (google.auth's AuthorizedSession): what the store calls."""

    def request(self, method: str, url: str, **kwargs: Any) -> Any: ...


def secret_id(deployment: str, owner: str, name: str) -> str:
    return f"{owner_prefix(deployment, owner)}{name}"


def owner_prefix(deployment: str, owner: str) -> str:
    """What every secret id of one owner starts with: an IAM condition's `resource.name.startsWith` for a team."""
    return f"jobplane-{deployment_tag(deployment)}-{owner}_S_"


class SecretManager:
    def __init__(self, session: Session, project: str, deployment: str, endpoint: str = GOOGLE_SECRETS_URL) -> None:
        self.session, self.project, self.deployment = session, project, deployment
        self.base = f"{endpoint.rstrip('/')}/v1/projects/{project}/secrets"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              params: dict[str, str] | None = None) -> dict[str, Any] | None:
        """The answer's JSON; None for a 404; AccessDenied for a 403."""
        answer = self.session.request(method, self.base + path, json=body, params=params, timeout=30)
        if answer.status_code == 404:
            return None
        if answer.status_code == 403:
            raise AccessDenied(f"secretmanager {method} {path}: access denied")
        if answer.status_code >= 400:
            raise RuntimeError(f"secretmanager {method} {path}: {answer.status_code} {answer.text[:300]}")
        found: dict[str, Any] = answer.json() if answer.content else {}
        return found

    def _labels(self, owner: str, name: str) -> dict[str, str]:
        return {"jobplane-deployment": deployment_tag(self.deployment), "jobplane-owner": owner,
                "jobplane-name": name, "jobplane-set-at": str(int(time.time()))}

    def put(self, owner: str, name: str, value: bytes) -> None:
        sid = secret_id(self.deployment, owner, name)
        labels = self._labels(owner, name)
        if self._call("GET", f"/{sid}") is None:
            self._call("POST", "", {"replication": {"automatic": {}}, "labels": labels}, {"secretId": sid})
        else:
            self._call("PATCH", f"/{sid}", {"labels": labels}, {"updateMask": "labels"})
        added = self._call("POST", f"/{sid}:addVersion", {"payload": {"data": base64.b64encode(value).decode()}})
        newest = (added or {}).get("name", "")
        listed = self._call("GET", f"/{sid}/versions", params={"filter": "state:ENABLED"}) or {}
        for version in listed.get("versions", []):
            if version.get("name") != newest:  # a rotation: the old value is gone, and billed no more
                self._call("POST", f"/{sid}/versions/{version['name'].rsplit('/', 1)[1]}:destroy", {})

    def get(self, owner: str, name: str) -> bytes:
        answer = self._call("GET", f"/{secret_id(self.deployment, owner, name)}/versions/latest:access")
        if answer is None:
            raise SecretMissing(name)
        return base64.b64decode(answer["payload"]["data"])

    def list(self, owner: str | None = None) -> list[SecretInfo]:
        tag, found, token = deployment_tag(self.deployment), [], ""
        query = f"labels.jobplane-deployment={tag}" + (f" AND labels.jobplane-owner={owner}" if owner else "")
        while True:
            page = self._call("GET", "", params={"filter": query, **({"pageToken": token} if token else {})}) or {}
            for secret in page.get("secrets", []):
                labels = secret.get("labels", {})
                at = labels.get("jobplane-set-at", "")
                found.append(SecretInfo(labels.get("jobplane-owner", ""), labels.get("jobplane-name", ""),
                                        datetime.fromtimestamp(int(at), UTC) if at.isdigit() else None))
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(found, key=lambda s: (s.owner, s.name))

    def delete(self, owner: str, name: str) -> bool:
        return self._call("DELETE", f"/{secret_id(self.deployment, owner, name)}") is not None


def secret_manager(project: str, deployment: str, endpoint: str | None = None, token: str | None = None
                   ) -> SecretManager:
    """The store with Application Default Credentials, or a person's access token (JOBPLANE_GCS_TOKEN)."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    from jobplane.clouds.gcs import access_token_credentials

    if token:
        credentials: Any = access_token_credentials(token)
    elif endpoint:  # a local fake: the platform team's own token there
        credentials = access_token_credentials("jobplane-local-platform")
    else:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
    return SecretManager(session, project, deployment, endpoint or GOOGLE_SECRETS_URL)
