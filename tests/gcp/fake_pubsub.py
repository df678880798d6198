"""A stand-in for Pub/Sub's publish REST call, enforcing what the real API checks of a publish: the topic
exists (404 NOT_FOUND otherwise), the body holds 1-1000 messages, each with base64 `data` or attributes,
attribute keys and values strings with non-empty keys (400 INVALID_ARGUMENT otherwise). It answers one
message id per message, like the service, and keeps what it accepted for the test to read. Reach it
as the clients reach Google's emulator: PUBSUB_EMULATOR_HOST=<host:port>."""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

_PUBLISH = re.compile(r"^/v1/(?P<topic>projects/[^/]+/topics/[^/:]+):publish$")


class _Quiet(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


@dataclass(frozen=True)
class Message:
    topic: str
    data: bytes
    attributes: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.data)


class FakePubSub:
    def __init__(self, topics: tuple[str, ...]) -> None:
        self.topics = set(topics)
        self.messages: list[Message] = []
        self._lock = threading.Lock()
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_port}"

    def start(self) -> FakePubSub:
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True, request_handler=_Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _wsgi(self, environ: Any, start_response: Any) -> Any:
        return self._answer(Request(environ))(environ, start_response)

    def _answer(self, request: Request) -> Response:
        match = _PUBLISH.match(request.path)
        if request.method != "POST" or match is None:
            return _error(404, "NOT_FOUND", f"no such method {request.method} {request.path}")
        topic = match.group("topic")
        if topic not in self.topics:
            return _error(404, "NOT_FOUND", f"Resource not found (resource={topic.rsplit('/', 1)[-1]}).")
        try:
            accepted = _messages(topic, request.get_json(force=True, silent=False))
        except ValueError as exc:
            return _error(400, "INVALID_ARGUMENT", str(exc))
        with self._lock:
            first = len(self.messages)
            self.messages += accepted
        return Response(json.dumps({"messageIds": [str(first + i + 1) for i in range(len(accepted))]}),
                        content_type="application/json")


def _messages(topic: str, body: Any) -> list[Message]:
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not 1 <= len(messages) <= 1000:
        raise ValueError("The value for message_count is invalid.")
    out = []
    for message in messages:
        attributes = message.get("attributes") or {}
        if not isinstance(attributes, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                       for k, v in attributes.items()):
            raise ValueError("Invalid attributes: keys and values must be non-empty-keyed strings.")
        try:
            data = base64.b64decode(message.get("data") or "", validate=True)
        except (binascii.Error, TypeError):
            raise ValueError("Invalid data: not base64.") from None
        if not data and not attributes:
            raise ValueError("Some messages contain no data and no attribute field.")
        out.append(Message(topic, data, attributes))
    return out


def _error(code: int, status: str, message: str) -> Response:
    return Response(json.dumps({"error": {"code": code, "message": message, "status": status}}), status=code,
                    content_type="application/json")
