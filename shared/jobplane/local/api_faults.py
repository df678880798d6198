"""Faults on demand in the local AWS cloud (`jobplane local up --faults RATE`): moto's server answers as AWS does
when it throttles or fails (jobplane.clouds.faults draws which request, from the seed).

- EC2, S3, STS, SSM and SNS requests: RATE of them get the service's throttling or server error in its own
  protocol (EC2's Response/Errors XML, S3's Error XML, STS's and SNS's ErrorResponse, SSM's JSON __type), and a
  third of the faults of requests that change something are made and then answered with a 500 (the answer
  lost), so the SDK sends them again.
- RunInstances honours ClientToken as EC2 does (moto ignores it): a request with a token already answered gets
  that answer, the same instances, instead of new ones; with MinCount > 1, RATE of them fail with
  InsufficientInstanceCapacity (EC2's all-or-nothing launch: no instance is made).
- A listing of instances (DescribeInstances without instance ids) leaves out an instance for up to 30 s after
  RunInstances answered it (EC2's eventual consistency); a describe of given ids is a lookup and sees it.

The local cloud's own clients (its provisioning, the instance runner playing EC2's hypervisor) name themselves in
their User-Agent (LOCAL_AGENT) and meet no faults: only what a deployment's functions, CLI and VMs call does. Each
fault, and each listing that left an instance out, is one line on the server's stderr (FAULT_LINE: the local
cloud's moto.log), for a scenario to count.
"""

from __future__ import annotations

import io
import re
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from jobplane.clouds.aws_local import LOCAL_AGENT
from jobplane.clouds.faults import ApiError, Faults, Kind

SERVICES = frozenset({"ec2", "s3", "sts", "ssm", "sns"})
_CREDENTIAL = re.compile(r"Credential=[^/,\s]+/\d{8}/[^/]+/([a-z0-9-]+)/aws4_request")
FAULT_LINE = "jobplane-fault {service} {call} {kind} {code}"
_CHANGES = ("Run", "Terminate", "Create", "Delete", "Modify", "Start", "Stop", "Reboot", "Put", "Publish",
            "Assume", "Subscribe", "Send", "Associate", "Attach", "Detach", "Register")

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
Answer = tuple[str, list[tuple[str, str]], bytes]


def said(service: str, call: str, kind: str, code: str) -> None:
    print(FAULT_LINE.format(service=service, call=call, kind=kind, code=code), file=sys.stderr, flush=True)


def service_of(environ: dict[str, Any]) -> str | None:
    """The service a SigV4-signed request (header or presigned query) is for; None: unsigned or another's."""
    found = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
    if found is None:
        credential = parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential", [""])[0]
        found = _CREDENTIAL.search("Credential=" + credential)
    return found.group(1) if found and found.group(1) in SERVICES else None


def params_of(environ: dict[str, Any], body: bytes) -> dict[str, list[str]]:
    """A query-protocol request's parameters (EC2, STS, SNS: the form body, or the query string)."""
    params = parse_qs(environ.get("QUERY_STRING", ""))
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        params.update(parse_qs(body.decode("utf-8", errors="replace")))
    return params


def call_of(service: str, environ: dict[str, Any], params: dict[str, list[str]]) -> tuple[str, bool]:
    """The call's name, and whether it changes something (its answer may be lost after it took effect)."""
    if service == "s3":
        method = environ.get("REQUEST_METHOD", "GET")
        return method, method in ("PUT", "POST", "DELETE")
    action = params.get("Action", [""])[0] or environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]
    return action, action.startswith(_CHANGES)


def error_answer(service: str, error: ApiError) -> Answer:
    """The error as the service writes it."""
    status = f"{error.status} {'Service Unavailable' if error.status == 503 else 'Error'}"
    rid = str(uuid.uuid4())
    if service == "ssm":
        body = f'{{"__type": "{error.code}", "message": "{error.message}"}}'.encode()
        return status, [("Content-Type", "application/x-amz-json-1.1"), ("x-amzn-RequestId", rid),
                        ("Content-Length", str(len(body)))], body
    if service == "ec2":
        text = (f"<Response><Errors><Error><Code>{error.code}</Code><Message>{error.message}</Message></Error>"
                f"</Errors><RequestID>{rid}</RequestID></Response>")
    elif service == "s3":
        text = f"<Error><Code>{error.code}</Code><Message>{error.message}</Message><RequestId>{rid}</RequestId></Error>"
    else:
        kind = "Sender" if error.status < 500 else "Receiver"
        text = (f"<ErrorResponse><Error><Type>{kind}</Type><Code>{error.code}</Code><Message>{error.message}"
                f"</Message></Error><RequestId>{rid}</RequestId></ErrorResponse>")
    body = b'<?xml version="1.0" encoding="UTF-8"?>\n' + text.encode()
    return status, [("Content-Type", "text/xml"), ("x-amzn-RequestId", rid), ("Content-Length", str(len(body)))], body


def _ns(root: ET.Element) -> str:
    """The answer's namespace as ElementTree spells it in a path ("{...}"; EC2's and moto's differ by a slash)."""
    return root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""


def _instance_items(root: ET.Element) -> list[tuple[ET.Element, ET.Element]]:
    """(instancesSet, item) of every instance in a RunInstances or DescribeInstances answer."""
    ns = _ns(root)
    groups = [*root.findall(f"{ns}instancesSet"), *root.iterfind(f"{ns}reservationSet/{ns}item/{ns}instancesSet")]
    return [(group, item) for group in groups for item in group.findall(f"{ns}item")]


def _instance_id(item: ET.Element) -> str:
    return next((child.text or "" for child in item if child.tag.endswith("instanceId")), "")


class FaultyApi:
    """moto's WSGI application behind the faults (one per server process)."""

    def __init__(self, app: App, faults: Faults, clock: Callable[[], float] = time.monotonic) -> None:
        self.app, self.faults, self.clock = app, faults, clock
        self.tokens: dict[str, Answer] = {}  # RunInstances ClientToken -> its answer
        self.born: dict[str, float] = {}  # instance id -> when RunInstances answered it
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        status, headers, body = self.answer(environ)
        start_response(status, headers)
        return [body]

    def _inner(self, environ: dict[str, Any]) -> Answer:
        started: list[Any] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [status, headers]
            return lambda _data: None

        chunks = self.app(environ, start)
        try:
            body = b"".join(chunks)
        finally:
            getattr(chunks, "close", lambda: None)()
        return started[0], list(started[1]), body

    def answer(self, environ: dict[str, Any]) -> Answer:
        service = service_of(environ)
        if service is None or LOCAL_AGENT in environ.get("HTTP_USER_AGENT", ""):
            return self._inner(environ)
        length = int(environ.get("CONTENT_LENGTH") or 0)  # never past the body: the stream may be the connection's
        body = environ["wsgi.input"].read() if environ.get("wsgi.input_terminated") else \
            environ["wsgi.input"].read(length) if length else b""
        environ["CONTENT_LENGTH"] = str(len(body))
        environ["wsgi.input"] = io.BytesIO(body)
        params = params_of(environ, body) if service in ("ec2", "sts", "sns") else {}
        call, mutates = call_of(service, environ, params)
        token = params.get("ClientToken", [""])[0] if call == "RunInstances" else ""
        with self.lock:
            if token and token in self.tokens:
                return self.tokens[token]  # EC2's idempotency: the first answer, the same instances
        nodes = int(params.get("MinCount", ["1"])[0]) if call == "RunInstances" else 1
        key = environ.get("PATH_INFO", "") if service == "s3" else token
        fault = self.faults.draw(service, call, key, mutates=mutates, nodes=nodes)
        if fault is not None:
            said(service, call, fault.kind, fault.error.code)
        if fault is not None and fault.kind is not Kind.LOST:
            return error_answer(service, fault.error)
        environ["wsgi.input"] = io.BytesIO(body)
        answer = self._inner(environ)
        if call == "RunInstances" and answer[0].startswith("200"):
            self._launched(token, answer)
        elif call == "DescribeInstances" and answer[0].startswith("200") and not _names_ids(params):
            answer = self._listed(answer)
        if fault is not None:  # it took effect; its answer is lost
            return error_answer(service, fault.error)
        return answer

    def _launched(self, token: str, answer: Answer) -> None:
        now = self.clock()
        with self.lock:
            if token:
                self.tokens[token] = answer
            for _, item in _instance_items(ET.fromstring(answer[2])):
                self.born.setdefault(_instance_id(item), now)

    def _listed(self, answer: Answer) -> Answer:
        """The listing without the instances not visible yet (and a reservation left with none, as EC2 lists)."""
        root = ET.fromstring(answer[2])
        now, hidden = self.clock(), 0
        for group, item in _instance_items(root):
            with self.lock:
                born = self.born.get(iid := _instance_id(item))
            if born is not None and now - born < self.faults.visible_after(iid):
                group.remove(item)
                hidden += 1
        if not hidden:
            return answer
        said("ec2", "DescribeInstances", "late", str(hidden))
        ns = _ns(root)
        for reservations in root.iterfind(f"{ns}reservationSet"):
            for reservation in list(reservations):
                if not reservation.findall(f"{ns}instancesSet/{ns}item"):
                    reservations.remove(reservation)
        ET.register_namespace("", ns[1:-1])
        body = ET.tostring(root, encoding="utf-8", xml_declaration=True)
        headers = [(k, v) for k, v in answer[1] if k.lower() != "content-length"]
        return answer[0], [*headers, ("Content-Length", str(len(body)))], body


def _names_ids(params: dict[str, list[str]]) -> bool:
    """A describe of given instances (InstanceId.N, or an instance-id filter): a lookup, not a listing."""
    if any(k.startswith("InstanceId.") for k in params):
        return True
    return any(v == ["instance-id"] for k, v in params.items() if k.startswith("Filter.") and k.endswith(".Name"))
