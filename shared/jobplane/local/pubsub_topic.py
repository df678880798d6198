"""The deployment's notification topic in the local GCP cloud: Pub/Sub's publish call on loopback, answered as
Pub/Sub answers it, with the messages kept for the local cloud to read as a pull subscription would.

The functions publish through jobplane.clouds.pubsub's REST call; PUBSUB_EMULATOR_HOST (the convention of
Google's clients and emulator) sends it here, over plain HTTP, without credentials. Only publish, on one topic:
another topic is NOT_FOUND, a message without data or attributes INVALID_ARGUMENT, as Pub/Sub says.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from jobplane.local.loopback import LoopbackServer, send_json


class _Refused(Exception):
    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


class PubSubTopic(LoopbackServer):
    name = "pubsub-topic"

    def __init__(self, topic: str, host: str = "127.0.0.1", port: int = 0) -> None:
        """topic: projects/<project>/topics/<name>."""
        super().__init__(host, port)
        self.topic = topic
        self._lock = threading.Lock()
        self._messages: list[dict[str, Any]] = []
        self._published = 0

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        body: dict[str, Any]
        try:
            status, body = 200, {"messageIds": self._publish(request)}
        except _Refused as err:
            status, body = err.code, {"error": {"code": err.code, "message": err.message, "status": err.status}}
        send_json(request, status, body)

    def _publish(self, request: BaseHTTPRequestHandler) -> list[str]:
        if request.command != "POST" or request.path != f"/v1/{self.topic}:publish":
            raise _Refused(404, "NOT_FOUND", f"Resource not found ({request.command} {request.path})")
        try:
            body = json.loads(request.rfile.read(int(request.headers.get("Content-Length") or 0)) or b"{}")
            messages = body["messages"]
            decoded = [{"data": base64.b64decode(m.get("data", ""), validate=True),
                        "attributes": dict(m.get("attributes") or {})} for m in messages]
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
            raise _Refused(400, "INVALID_ARGUMENT", f"Invalid publish request: {exc}") from None
        if not decoded or any(not m["data"] and not m["attributes"] for m in decoded):
            raise _Refused(400, "INVALID_ARGUMENT", "Each message needs data or attributes, and one is needed")
        with self._lock:
            ids = [str(self._published + i + 1) for i in range(len(decoded))]
            self._published += len(decoded)
            self._messages.extend(decoded)
        return ids

    def pull(self) -> list[dict[str, Any]]:
        """The JSON data of the messages published since the last call, oldest first (not JSON: skipped)."""
        with self._lock:
            messages, self._messages = self._messages, []
        out = []
        for message in messages:
            try:
                data = json.loads(message["data"])
            except ValueError:
                continue
            if isinstance(data, dict):
                out.append(data)
        return out
