"""Metadata over the GCE metadata server (urllib only: the agent must not pay for google-auth).

Ownership facts live in instance metadata attributes (the metadata server does not expose labels):
the Compute adapter writes jobplane-job-id, jobplane-attempt, jobplane-managed (and jobplane-rank for
single VMs) as both labels and attributes. A bulk-inserted VM's rank is its name's number minus one
(names are <prefix>-0001, -0002, ... in rank order).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta

from jobplane.clouds.base import TAG_RANK

DEFAULT_HOST = "metadata.google.internal"
HOST_ENV = "GCE_METADATA_HOST"  # host[:port], the convention of Google's clients; read by agent/cli.py
PREEMPTION_GRACE_S = 30  # GCE gives Spot VMs about 30 s between the notice and the stop


class MetadataError(Exception):
    pass


def gce_key(tag: str) -> str:
    """EC2-style tag key to GCE label / attribute key: jobplane:job-id -> jobplane-job-id."""
    return tag.replace(":", "-")


class GceMetadata:
    """base_url: an explicit server (tests), else the one at host (host[:port]), else the real one."""

    def __init__(self, base_url: str | None = None, timeout: float = 5.0, *, host: str | None = None) -> None:
        if base_url is None:
            base_url = f"http://{host or DEFAULT_HOST}/computeMetadata/v1/"
        self.base_url = base_url.rstrip("/") + "/"
        self.timeout = timeout
        self._cache: dict[str, str | None] = {}

    def get(self, path: str) -> str | None:
        """The value at path, or None when the server says 404."""
        return self._fetch(path)[0]

    def _fetch(self, path: str, *, timeout: float | None = None, params: str = "") -> tuple[str | None, str]:
        """(value or None on 404, ETag)."""
        url = self.base_url + path + (f"?{params}" if params else "")
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                if response.headers.get("Metadata-Flavor") != "Google":
                    raise MetadataError(f"{url} did not answer as a GCE metadata server")
                return str(response.read().decode()), str(response.headers.get("ETag", ""))
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None, ""
            raise MetadataError(f"{url}: HTTP {err.code}") from err
        except OSError as err:
            raise MetadataError(f"{url}: {err}") from err

    def _fixed(self, path: str) -> str | None:
        """Values that never change on a VM are fetched once."""
        if path not in self._cache:
            self._cache[path] = self.get(path)
        return self._cache[path]

    def _required(self, path: str) -> str:
        value = self._fixed(path)
        if value is None:
            raise MetadataError(f"the metadata server has no {path}")
        return value

    def instance_id(self) -> str:
        """zone/name: the same id the Compute adapter reports for this VM."""
        zone = self._required("instance/zone").rsplit("/", 1)[-1]
        return f"{zone}/{self._required('instance/name')}"

    def identity_token(self, audience: str) -> str:
        """A Google-signed JWT naming this VM (format=full: project, zone, name and id), for `audience`; never
        cached, since each lasts an hour."""
        value, _ = self._fetch("instance/service-accounts/default/identity",
                               params=urllib.parse.urlencode({"audience": audience, "format": "full"}))
        if not value:
            raise MetadataError("the metadata server gave no identity token")
        return value

    def registry_login(self, host: str) -> tuple[str, str] | None:
        """Artifact Registry (and Container Registry) take the VM's access token as a password; any other
        registry is pulled from anonymously (None)."""
        if not (host.endswith("-docker.pkg.dev") or host == "gcr.io" or host.endswith(".gcr.io")):
            return None
        value = self.get("instance/service-accounts/default/token")
        if not value:
            raise MetadataError("the metadata server gave no access token")
        return "oauth2accesstoken", str(json.loads(value)["access_token"])

    def private_ip(self) -> str:
        return self._required("instance/network-interfaces/0/ip")

    def tag(self, key: str) -> str | None:
        return self._fixed(f"instance/attributes/{gce_key(key)}")

    def rank(self) -> int:
        explicit = self.tag(TAG_RANK)
        if explicit is not None:
            return int(explicit)
        suffix = self._required("instance/name").rsplit("-", 1)[-1]
        if not suffix.isdigit():
            raise MetadataError(f"no {gce_key(TAG_RANK)} attribute and the name has no rank number")
        return int(suffix) - 1

    def preemption_notice(self) -> dict[str, str] | None:
        """{"action": "terminate", "time": when the VM stops} once GCE has preempted this VM, else None."""
        if self.get("instance/preempted") != "TRUE":
            return None
        return self._notice()

    def wait_for_preemption(self, timeout: float) -> dict[str, str] | None:
        """Block (server side, wait_for_change) until the notice or the timeout, instead of polling."""
        value, etag = self._fetch("instance/preempted")
        if value != "TRUE":
            # last_etag: a change between the two requests returns at once rather than being missed
            params = f"wait_for_change=true&last_etag={etag}&timeout_sec={max(1, int(timeout))}"
            value, _ = self._fetch("instance/preempted", params=params, timeout=timeout + self.timeout)
        return self._notice() if value == "TRUE" else None

    @staticmethod
    def _notice() -> dict[str, str]:
        at = datetime.now(UTC) + timedelta(seconds=PREEMPTION_GRACE_S)
        return {"action": "terminate", "time": at.isoformat(timespec="seconds")}
