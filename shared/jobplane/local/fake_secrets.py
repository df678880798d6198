"""A fake of Secret Manager's REST API (v1) for the local GCP cloud: what clouds/gcp_secrets.py calls, with the
grants infra/gcp gives, held to the caller's bearer token: the platform team and the functions (the vend function
reads a job's secrets for it) reach every secret; a member token member-<owner> creates, rotates, lists and deletes
only its own team's (`resource.name.startsWith(.../secrets/jobplane-<tag>-<owner>_S_)`) and reads no value; any other
token (a job's downscoped one, which Google scopes to Cloud Storage only; a VM's) is refused. Never deployed."""

from __future__ import annotations

import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from jobplane.local.gcp_grants import MEMBER_TOKEN
from jobplane.local.loopback import LoopbackServer, send_json

PLATFORM_TOKENS = frozenset({"jobplane-local-platform", "jobplane-local-functions"})
_ID = re.compile(r"^jobplane-[0-9a-f]{6}-(?P<owner>[a-z][a-z0-9_-]*)_S_[a-z0-9-]+$")
_PATH = re.compile(r"^/v1/projects/(?P<project>[^/]+)/secrets(?:/(?P<id>[A-Za-z0-9_-]+))?"
                   r"(?P<rest>(?::addVersion)|(?:/versions(?:/(?P<version>[a-z0-9]+)(?P<verb>:access|:destroy)?)?))?$")


class FakeSecretManager(LoopbackServer):
    name = "fake-secret-manager"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self._lock = threading.Lock()
        self._secrets: dict[str, dict[str, Any]] = {}  # id -> {labels, createTime, versions: [{n, data, state}]}

    @property
    def url(self) -> str:
        return f"http://{self.address}" if self.running else ""

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(request.path)
        match = _PATH.match(parts.path)
        if match is None:
            return send_json(request, 404, {"error": {"code": 404, "message": "not found"}})
        length = int(request.headers.get("Content-Length") or 0)
        body = json.loads(request.rfile.read(length) or b"{}") if length else {}
        token = (request.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        status, answer = self.answer(request.command, match, token, body, query)
        send_json(request, status, answer)

    def answer(self, method: str, match: re.Match[str], token: str, body: dict[str, Any],
               query: dict[str, str]) -> tuple[int, Any]:
        sid = match["id"] or query.get("secretId")
        reading = match["verb"] == ":access"
        if token not in PLATFORM_TOKENS:
            owner = token.removeprefix(MEMBER_TOKEN) if token.startswith(MEMBER_TOKEN) else None
            mine = sid is not None and (found := _ID.match(sid)) is not None and found["owner"] == owner
            listing = method == "GET" and sid is None
            if owner is None or reading or not (mine or listing):
                return 403, {"error": {"code": 403, "message": "Permission denied on the secret (or it may not "
                                                               "exist)"}}
        with self._lock:
            return self._apply(method, match, sid, body, query)

    def _apply(self, method: str, match: re.Match[str], sid: str | None, body: dict[str, Any],
               query: dict[str, str]) -> tuple[int, Any]:
        project, secrets = match["project"], self._secrets
        name = f"projects/{project}/secrets/{sid}"
        if sid is None:  # a listing, by labels: `labels.k=v AND labels.k2=v2`
            wanted = dict(re.findall(r"labels\.([a-z0-9_-]+)=([a-z0-9_-]+)", query.get("filter", "")))
            return 200, {"secrets": [{"name": f"projects/{project}/secrets/{i}", "labels": s["labels"]}
                                     for i, s in sorted(secrets.items())
                                     if all(s["labels"].get(k) == v for k, v in wanted.items())]}
        secret = secrets.get(sid)
        if method == "POST" and not match["id"]:
            if secret is not None:
                return 409, {"error": {"code": 409, "message": "already exists"}}
            secrets[sid] = {"labels": body.get("labels", {}), "versions": [],
                            "createTime": datetime.now(UTC).isoformat()}
            return 200, {"name": name, "labels": secrets[sid]["labels"]}
        if secret is None:
            return 404, {"error": {"code": 404, "message": f"{name} not found"}}
        rest, versions = match["rest"] or "", secret["versions"]
        if rest == ":addVersion":
            versions.append({"n": len(versions) + 1, "data": body["payload"]["data"], "state": "ENABLED"})
            return 200, {"name": f"{name}/versions/{len(versions)}", "state": "ENABLED"}
        if rest == "/versions":
            return 200, {"versions": [{"name": f"{name}/versions/{v['n']}", "state": v["state"]} for v in versions
                                      if v["state"] == "ENABLED"]}
        if match["version"]:
            live = [v for v in versions if v["state"] == "ENABLED"]
            chosen = live[-1:] if match["version"] == "latest" else [v for v in live if str(v["n"]) == match["version"]]
            if not chosen:
                return 404, {"error": {"code": 404, "message": "no such version"}}
            if match["verb"] == ":destroy":
                chosen[0]["state"], chosen[0]["data"] = "DESTROYED", ""
                return 200, {"name": f"{name}/versions/{chosen[0]['n']}", "state": "DESTROYED"}
            return 200, {"name": f"{name}/versions/{chosen[0]['n']}", "payload": {"data": chosen[0]["data"]}}
        if method == "PATCH":
            secret["labels"] = body.get("labels", secret["labels"])
        elif method == "DELETE":
            del secrets[sid]
            return 200, {}
        return 200, {"name": name, "labels": secret["labels"]}
