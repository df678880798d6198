"""A Lambda function URL on loopback: each POST becomes the payload-format 2.0 event a function URL delivers,
given to a handler in this process (the local cloud's vending function, functions/aws/vend.py), and the
handler's {statusCode, headers, body} becomes the HTTP answer.

It does not check the request's SigV4 signature, as AWS does for AuthType AWS_IAM before the function runs: the
local cloud has no IAM of its own to check it against. What the vending function relies on is its identity
proof, the signed sts:GetCallerIdentity inside the body, which moto (jobplane.local.moto_server) does verify.
It listens on 127.0.0.1 only, ever.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from jobplane.clouds.faults import Faults, Kind
from jobplane.local.api_faults import said
from jobplane.local.loopback import LoopbackServer

Invoke = Callable[[dict[str, Any]], Any]  # the event -> the handler's answer (None: the invocation failed)
MAX_BODY = 1 << 20


def event(method: str, path: str, query: str, headers: dict[str, str], body: bytes, source_ip: str,
          domain: str) -> dict[str, Any]:
    """A function URL's event (payload format 2.0) for one request."""
    text = body.decode("utf-8", errors="strict") if body else ""
    now = datetime.now(UTC)
    return {
        "version": "2.0", "routeKey": "$default", "rawPath": path or "/", "rawQueryString": query,
        "headers": {k.lower(): v for k, v in headers.items()},
        "requestContext": {
            "accountId": "anonymous", "apiId": domain.split(".")[0], "domainName": domain,
            "domainPrefix": domain.split(".")[0], "requestId": str(uuid.uuid4()), "routeKey": "$default",
            "stage": "$default", "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"), "timeEpoch": int(time.time() * 1000),
            "http": {"method": method, "path": path or "/", "protocol": "HTTP/1.1", "sourceIp": source_ip,
                     "userAgent": headers.get("User-Agent", "")},
        },
        "body": text, "isBase64Encoded": False,
    }


class FunctionUrl(LoopbackServer):
    name = "function-url"

    def __init__(self, invoke: Invoke, port: int = 0, faults: Faults | None = None) -> None:
        super().__init__("127.0.0.1", port)
        self.invoke = invoke
        self.faults = faults  # `local up --faults`: Lambda's throttles and errors, and answers lost after the run

    @property
    def url(self) -> str:
        return f"http://{self.address}/"

    def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        fault = self.faults.draw("vend", "invoke", mutates=True) if self.faults else None
        if fault:
            said("vend", "invoke", fault.kind, fault.error.code)
        failed = fault and (fault.error.status, {"Content-Type": "application/json"},
                            json.dumps({"Message": fault.error.message, "Type": fault.error.code}).encode())
        if fault and failed and fault.kind is not Kind.LOST:
            return failed
        result = self.invoke(request)
        if failed:
            return failed  # it ran; its answer is lost
        if not isinstance(result, dict) or "statusCode" not in result:
            return 502, {"Content-Type": "application/json"}, b'{"error": "the function failed"}'
        body = result.get("body") or ""
        data = base64.b64decode(body) if result.get("isBase64Encoded") else str(body).encode()
        return int(result["statusCode"]), {str(k): str(v) for k, v in (result.get("headers") or {}).items()}, data

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        if request.command != "POST":
            return _reply(request, 405, {}, b'{"error": "a function URL here takes POST"}')
        length = int(request.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return _reply(request, 413, {}, b'{"error": "body too large"}')
        body = request.rfile.read(length)
        parts = urlsplit(request.path)
        try:
            payload = event("POST", parts.path, parts.query, dict(request.headers.items()), body,
                            request.client_address[0], request.headers.get("Host", "127.0.0.1"))
        except UnicodeDecodeError:
            return _reply(request, 400, {}, json.dumps({"error": "body is not UTF-8"}).encode())
        _reply(request, *self.answer(payload))


def _reply(request: BaseHTTPRequestHandler, status: int, headers: dict[str, str], data: bytes) -> None:
    request.send_response(status)
    headers.setdefault("Content-Type", "application/json")
    for k, v in headers.items():
        request.send_header(k, v)
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)
