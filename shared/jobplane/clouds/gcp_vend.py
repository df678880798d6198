"""The agent's GCS credentials on GCP: its job's, vended by the control plane (functions/gcp/main.py `vend`),
never its VM's own (which may only read the agent bundles).

Each refresh asks the metadata server for an identity token for the vending function's URL, POSTs it with the
job and attempt the VM serves, and keeps the downscoped token with its expiry, so google-auth refreshes a few
minutes before it ends. A 403 is final (CredentialsRefused: the attempt is over, or the VM is not one of it);
anything transient is retried here a few times, then left to the storage client's own retries.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from google.auth import credentials as google_credentials
from google.auth import exceptions
from google.auth.transport import Request
from google.auth.transport.requests import Request as GoogleRequest

from jobplane.clouds.base import CredentialsRefused
from jobplane.clouds.gce_metadata import GceMetadata, MetadataError
from jobplane.model.secrets import SecretMissing

log = logging.getLogger("jobplane.agent")

ATTEMPTS = 4
PAUSE_S = 1.0  # doubled after each failed try: 1, 2, 4 s
TIMEOUT_S = 30.0
_TRANSIENT = frozenset({408, 429, 500, 502, 503, 504})


class VendedCredentials(google_credentials.Credentials):
    """A job's GCS access token from the vending function, refreshed before it expires."""

    def __init__(self, vend_url: str, job_id: str, attempt: int, metadata: GceMetadata,
                 pause: float = PAUSE_S) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.vend_url, self.job_id, self.attempt = vend_url, job_id, attempt
        self.metadata = metadata
        self.pause = pause
        self.secrets: dict[str, bytes] | None = None  # the values the last grant carried (its spec's secrets)

    def refresh(self, request: Request) -> None:
        wait = self.pause
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self._ask(request)
                return
            except (MetadataError, exceptions.TransportError) as err:
                if attempt == ATTEMPTS:
                    raise exceptions.TransportError(  # type: ignore[no-untyped-call]
                        f"no credentials from {self.vend_url}: {err}") from err
                log.warning("asking %s for credentials failed (%s); again in %.0f s", self.vend_url, err, wait)
                time.sleep(wait)
                wait *= 2

    def _ask(self, request: Request) -> None:
        body = {"identity_token": self.metadata.identity_token(self.vend_url), "job_id": self.job_id,
                "attempt": self.attempt, "instance_id": self.metadata.instance_id()}
        response = request(url=self.vend_url, method="POST", body=json.dumps(body).encode(), timeout=TIMEOUT_S,
                           headers={"Content-Type": "application/json",
                                    "Authorization": f"Bearer {body['identity_token']}"})
        answer = _json(response.data)
        if response.status == 403:
            raise CredentialsRefused(str(answer.get("refused") or answer or "refused"))
        if response.status in _TRANSIENT:
            raise exceptions.TransportError(f"HTTP {response.status} from {self.vend_url}")  # type: ignore[no-untyped-call]
        if response.status != 200 or not isinstance(answer.get("access_token"), str):
            raise exceptions.RefreshError(  # type: ignore[no-untyped-call]
                f"{self.vend_url} answered HTTP {response.status}: {answer}")
        self.token = answer["access_token"]
        named = answer.get("secrets") or {}
        self.secrets = {str(k): base64.b64decode(v) for k, v in named.items()} if isinstance(named, dict) else {}
        # naive UTC, as google-auth compares it (its _helpers.utcnow)
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        self.expiry = now + datetime.timedelta(seconds=int(answer.get("expires_in") or 0))


def _json(data: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(data or b"{}")
    except ValueError:
        return {"body": bytes(data or b"")[:200].decode(errors="replace")}
    return parsed if isinstance(parsed, dict) else {"body": parsed}


def secret_reader(credentials: VendedCredentials) -> Callable[[str, str], bytes]:
    """(owner, name) -> a value the vending function's latest grant carried (asking it first if none has been);
    SecretMissing for a secret it did not give: not the job's owner's, or not named by its spec."""
    def read(owner: str, name: str) -> bytes:
        if credentials.secrets is None:
            credentials.refresh(GoogleRequest())
        value = (credentials.secrets or {}).get(name)
        if value is None:
            raise SecretMissing(f"{name}: the vending function gave this job no secret {name!r} of {owner}")
        return value
    return read


def vended_credentials(vend_url: str, job_id: str, attempt: int,
                       metadata_host: str | None) -> VendedCredentials:
    """The job's credentials for GcsStore(credentials=...); metadata_host: GCE_METADATA_HOST (None: the real one)."""
    return VendedCredentials(vend_url, job_id, attempt, GceMetadata(host=metadata_host))
