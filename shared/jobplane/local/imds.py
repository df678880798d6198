"""A fake EC2 instance metadata service (IMDSv2) for tests and the local cloud.

One FakeImds serves ONE instance on its own loopback port (port 0 = any free port); the local cloud
starts one per instance and hands the instance process AWS_EC2_METADATA_SERVICE_ENDPOINT=<fake.url>.
A thread per server is cheap, and per-port identity is what a VM sees: it cannot name another VM's
metadata. It enforces what the real service does and the agent relies on:
- GETs need a token from PUT /latest/api/token (X-aws-ec2-metadata-token-ttl-seconds 1..21600):
  missing, unknown or expired tokens get 401; a PUT carrying X-Forwarded-For is refused (403).
- meta-data/instance-id, ami-launch-index, local-ipv4, public-ipv4 (404 without one), instance-type,
  instance-life-cycle, placement/availability-zone, placement/region, tags/instance[/<key>] (404 for a
  missing tag) and spot/instance-action (404 until set_notice(), then {"action", "time"}).
- meta-data/iam/security-credentials/ (the instance profile's role name) and .../<role> (EC2's JSON: Code,
  Type, AccessKeyId, SecretAccessKey, Token, Expiration, LastUpdated) when the instance has a role: the
  `credentials` callable gives a session of it (the local cloud's: STS AssumeRole named after the instance),
  asked again once the one served has under REFRESH_BEFORE left, as EC2 rotates them.

    with FakeImds(ImdsInstance("i-0abc", launch_index=1, tags={"jobplane:job-id": "j1"})) as imds:
        env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.url
        ...
        imds.set_notice()  # Spot interruption warning, two minutes ahead, like EC2
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

MAX_TTL = 21600
REFRESH_BEFORE = timedelta(minutes=15)  # EC2 serves new role credentials well before the old ones expire
Credentials = Callable[[], dict[str, Any]]  # {AccessKeyId, SecretAccessKey, SessionToken, Expiration: datetime}


@dataclass
class ImdsInstance:
    """What the fake serves about its one instance; mutate through FakeImds to stay thread-safe."""

    instance_id: str
    launch_index: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    availability_zone: str = "us-east-1a"
    local_ipv4: str = "127.0.0.1"
    instance_type: str = "t3.micro"
    spot: bool = False
    public_ipv4: str | None = None  # 404, as on EC2, when the instance has none
    role: str | None = None  # the instance profile's role name; None: no role, no credentials


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up before its reply (an agent stopping, a timed-out probe) is normal: one debug line,
        not socketserver's traceback on the console."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            logging.getLogger(__name__).debug("IMDS client %s hung up: %s", client_address, error)
            return
        super().handle_error(request, client_address)


class FakeImds:
    def __init__(self, instance: ImdsInstance, host: str = "127.0.0.1", port: int = 0,
                 credentials: Credentials | None = None) -> None:
        self.instance = instance
        self._credentials = credentials
        self._served: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}  # token -> monotonic expiry
        self._notice: dict[str, str] | None = None
        self._server = _Server((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeImds:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name=f"imds-{self.instance.instance_id}",
                                            kwargs={"poll_interval": 0.1}, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FakeImds:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # ---- what a test or the local cloud changes -----------------------------------------------------------
    def set_notice(self, action: str = "terminate", at: datetime | None = None) -> dict[str, str]:
        """Serve a Spot interruption notice (EC2 gives two minutes' warning); returns the body served."""
        when = at or datetime.now(UTC) + timedelta(minutes=2)
        notice = {"action": action, "time": when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        with self._lock:
            self._notice = notice
        return dict(notice)

    # ---- request handling (called from the handler threads) ------------------------------------------------
    def _issue_token(self, ttl_header: str | None, forwarded: bool) -> tuple[int, str]:
        if forwarded:
            return 403, "Forbidden"
        try:
            ttl = int(ttl_header or "")
        except ValueError:
            return 400, "X-aws-ec2-metadata-token-ttl-seconds must be an integer"
        if not 1 <= ttl <= MAX_TTL:
            return 400, f"X-aws-ec2-metadata-token-ttl-seconds must be 1..{MAX_TTL}"
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = time.monotonic() + ttl
        return 200, token

    def _valid(self, token: str | None) -> bool:
        with self._lock:
            expiry = self._tokens.get(token or "")
            return expiry is not None and expiry > time.monotonic()

    def _role_credentials(self) -> str:
        """EC2's JSON for the role's current session (a new one when the served one is near its end)."""
        assert self._credentials is not None
        now = datetime.now(UTC)
        if self._served is None or self._served["Expiration"] - now < REFRESH_BEFORE:
            self._served = {**self._credentials(), "LastUpdated": now}
        got = self._served

        def stamp(when: datetime) -> str:
            return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        return json.dumps({"Code": "Success", "LastUpdated": stamp(got["LastUpdated"]), "Type": "AWS-HMAC",
                           "AccessKeyId": got["AccessKeyId"], "SecretAccessKey": got["SecretAccessKey"],
                           "Token": got["SessionToken"], "Expiration": stamp(got["Expiration"])})

    def _lookup(self, path: str) -> str | None:
        with self._lock:
            inst = self.instance
            if inst.role is not None and self._credentials is not None:
                if path.rstrip("/") == "meta-data/iam/security-credentials":
                    return inst.role
                if path == f"meta-data/iam/security-credentials/{inst.role}":
                    return self._role_credentials()
            if path.startswith("meta-data/tags/instance/"):
                return inst.tags.get(unquote(path.removeprefix("meta-data/tags/instance/")))
            if path == "meta-data/spot/instance-action":
                return json.dumps(self._notice) if self._notice else None
            if path == "meta-data/public-ipv4":
                return inst.public_ipv4
            values = {
                "meta-data/instance-id": inst.instance_id,
                "meta-data/ami-launch-index": str(inst.launch_index),
                "meta-data/local-ipv4": inst.local_ipv4,
                "meta-data/instance-type": inst.instance_type,
                "meta-data/instance-life-cycle": "spot" if inst.spot else "on-demand",
                "meta-data/placement/availability-zone": inst.availability_zone,
                "meta-data/placement/region": inst.availability_zone[:-1],
                "meta-data/tags/instance": "\n".join(sorted(inst.tags)),
            }
            return values.get(path.rstrip("/"))

    def _record(self, method: str, path: str, status: int) -> None:
        """Each answer, as it is sent (tests keep a log)."""


def _handler_for(imds: FakeImds) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "EC2ws"

        def do_PUT(self) -> None:
            path = urlsplit(self.path).path
            if path != "/latest/api/token":
                return self._reply(405, "Method Not Allowed")
            status, body = imds._issue_token(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"),
                                             "X-Forwarded-For" in self.headers)
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            self._reply(status, body, {"X-aws-ec2-metadata-token-ttl-seconds": ttl} if status == 200 else None)

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == "/latest/api/token":
                return self._reply(405, "Method Not Allowed")
            if not imds._valid(self.headers.get("X-aws-ec2-metadata-token")):
                return self._reply(401, "Unauthorized")
            value = imds._lookup(path.removeprefix("/latest/")) if path.startswith("/latest/") else None
            if value is None:
                return self._reply(404, "Not Found")
            self._reply(200, value)

        def _reply(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
            imds._record(self.command, urlsplit(self.path).path, status)
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would drown the agent's own output

    return Handler
