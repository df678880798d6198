"""EC2 instance metadata (IMDSv2) for the agent: identity, ownership tags and the Spot interruption notice.

IMDSv2 only: PUT /latest/api/token for a session token, then GETs carrying it. The launcher sets
HttpTokens=required and InstanceMetadataTags=enabled, so tags are readable at
/latest/meta-data/tags/instance/<key>. stdlib urllib only: the agent must not need boto3 to find out
who it is, and botocore's IMDSFetcher ignores AWS_EC2_METADATA_SERVICE_ENDPOINT (NOTES.md).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from urllib.parse import quote

DEFAULT_ENDPOINT = "http://169.254.169.254"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"  # read by the agent's entry point (agent/cli.py)
TOKEN_TTL = 21600  # seconds; the maximum IMDS allows
_REFRESH_MARGIN = 60  # fetch a new token this long before the old one expires
# IMDS is link-local: never send it through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class MetadataError(Exception):
    """The metadata service did not answer, or answered something unusable."""


class Ec2Metadata:
    """The Metadata protocol (clouds/base.py) over IMDSv2.

    base_url: an explicit endpoint (the agent passes $AWS_EC2_METADATA_SERVICE_ENDPOINT), else the link-local one.
    Timeouts are short and retries few: IMDS answers in milliseconds or not at all, and the agent polls.
    """

    def __init__(self, base_url: str | None = None, *, timeout: float = 2.0, retries: int = 3,
                 token_ttl: int = TOKEN_TTL) -> None:
        self.base_url = (base_url or DEFAULT_ENDPOINT).rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.token_ttl = token_ttl
        self._token: str | None = None
        self._token_expires = 0.0

    # ---- Metadata protocol ---------------------------------------------------------------------------
    def instance_id(self) -> str:
        return self._require("meta-data/instance-id")

    def rank(self) -> int:
        raw = self._require("meta-data/ami-launch-index")
        try:
            return int(raw)
        except ValueError:
            raise MetadataError(f"ami-launch-index is not a number: {raw!r}") from None

    def tag(self, key: str) -> str | None:
        """An instance tag; None when the tag is absent (or tags are not enabled in metadata)."""
        return self.get("meta-data/tags/instance/" + quote(key, safe=":@=+,._-"))

    def preemption_notice(self) -> dict[str, str] | None:
        """{"action": "terminate"|"stop"|"hibernate", "time": ISO-8601} once EC2 sends it; 404 before."""
        raw = self.get("meta-data/spot/instance-action")
        if raw is None:
            return None
        try:
            body = json.loads(raw)
        except ValueError:
            raise MetadataError(f"spot/instance-action is not JSON: {raw[:200]!r}") from None
        if not isinstance(body, dict):
            raise MetadataError(f"spot/instance-action is not an object: {raw[:200]!r}")
        return {str(k): str(v) for k, v in body.items()}

    # ---- extras the agent uses when present ---------------------------------------------------------------
    def local_ipv4(self) -> str | None:
        return self.get("meta-data/local-ipv4")

    def instance_type(self) -> str | None:
        return self.get("meta-data/instance-type")

    # ---- transport -------------------------------------------------------------------------------------
    def _require(self, path: str) -> str:
        value = self.get(path)
        if value is None:
            raise MetadataError(f"{path} not found in instance metadata at {self.base_url}")
        return value

    def get(self, path: str) -> str | None:
        """GET /latest/<path> with a session token; None on 404. A 401 (expired token) refreshes once."""
        for refreshed in (False, True):
            status, body = self._request("GET", f"/latest/{path}", {"X-aws-ec2-metadata-token": self._session()})
            if status == 401 and not refreshed:
                self._token = None
                continue
            if status == 404:
                return None
            if status == 200:
                return body
            raise MetadataError(f"GET {path}: HTTP {status} {body[:200]!r}")
        raise MetadataError(f"GET {path}: token refused twice")  # pragma: no cover - loop always returns

    def _session(self) -> str:
        if self._token is None or time.monotonic() >= self._token_expires:
            status, body = self._request(
                "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl)}
            )
            if status != 200 or not body:
                raise MetadataError(f"IMDSv2 token request failed: HTTP {status} {body[:200]!r}")
            self._token = body
            self._token_expires = time.monotonic() + max(1, self.token_ttl - _REFRESH_MARGIN)
        return self._token

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        """(status, body); retries connection errors and 5xx with a short pause, never 4xx."""
        last: Exception | None = None
        for attempt in range(self.retries):
            if attempt:
                time.sleep(0.2 * 2**attempt)
            req = urllib.request.Request(self.base_url + path, method=method, headers=headers)
            try:
                with _OPENER.open(req, timeout=self.timeout) as resp:
                    return int(resp.status), resp.read().decode()
            except urllib.error.HTTPError as err:
                if err.code < 500:
                    return err.code, err.read().decode(errors="replace")
                last = err
            except (urllib.error.URLError, OSError) as err:
                last = err
        raise MetadataError(f"{method} {self.base_url}{path}: {last}")
