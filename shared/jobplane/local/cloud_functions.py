"""GCP's functions in the local cloud: functions/gcp/main.py's entry points, each through functions-framework's
own test client, as Cloud Functions (gen2) runs them. New registry objects arrive at the bucket-event function
as the binary-mode CloudEvents Eventarc delivers (google.cloud.storage.object.v1.finalized), and every
schedule is an HTTP POST with the body Cloud Scheduler sends ("{}").

A CloudEvent function answers nothing; what it did is in its structured log entry (its `result` field, as
Cloud Logging would show it), which is how the local cloud's console hears of it.

The VMs call one function themselves, `vend` (their job's storage credentials): it is served on loopback over
real HTTP (HttpFunction), as Cloud Run serves it, from the same functions-framework app.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import IO, Any

from werkzeug.serving import BaseWSGIServer, make_server

from jobplane.local.loopback import BackgroundServer
from jobplane.local.triggers import Functions, Result, repo_root

MAIN = repo_root() / "functions" / "gcp" / "main.py"
FINALIZED = "google.cloud.storage.object.v1.finalized"


def finalized(bucket: str, name: str, size: int) -> dict[str, Any]:
    """The request Eventarc makes for a new object: a binary-mode CloudEvent (test client keyword arguments)."""
    return {"headers": {"ce-id": uuid.uuid4().hex, "ce-specversion": "1.0", "ce-type": FINALIZED,
                        "ce-source": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
                        "ce-subject": f"objects/{name}", "Content-Type": "application/json"},
            "data": json.dumps({"bucket": bucket, "name": name, "size": str(size), "generation": "1",
                                "kind": "storage#object"})}


class _Results(logging.Handler):
    """The `result` of the log entries one thread's invocation writes."""

    def __init__(self) -> None:
        super().__init__()
        self.thread: int | None = None
        self.found: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread and hasattr(record, "result"):
            self.found.append(record.result)


class CloudFunctions(Functions):
    names = ("launcher", "launcher_backstop", "sweeper", "rerun", "uptime_cap", "vend")
    scheduled = ("launcher_backstop", "sweeper", "rerun", "uptime_cap")  # Cloud Scheduler jobs
    CLOUD_EVENT = "launcher"  # the bucket-event function; the others are HTTP

    def __init__(self, bucket: str, log_stream: IO[str] | None = None, on_result: Result | None = None) -> None:
        super().__init__(log_stream, on_result)
        self.bucket = bucket
        self.clients: dict[str, Any] = {}
        self.results = _Results()
        self.lock = threading.Lock()

    def app(self, name: str) -> Any:
        """The function's functions-framework (Flask) app, with its log going where this cloud's goes."""
        from functions_framework import create_app

        kind = "cloudevent" if name == self.CLOUD_EVENT else "http"
        app = create_app(name, str(MAIN), kind)  # type: ignore[no-untyped-call]
        app.config["PROPAGATE_EXCEPTIONS"] = True  # a failed invocation is logged with its traceback
        self._route_logs()
        return app

    def _route_logs(self) -> None:
        functions_log = logging.getLogger("jobplane")
        functions_log.propagate = False  # this process plays Cloud Run: the function's own lines only
        if self.results not in functions_log.handlers:
            functions_log.addHandler(self.results)
        if self.log_stream is not None:
            for handler in functions_log.handlers:
                if type(handler) is logging.StreamHandler:
                    handler.setStream(self.log_stream)

    def client(self, name: str) -> Any:
        if name not in self.clients:
            self.clients[name] = self.app(name).test_client()
        return self.clients[name]

    def call(self, name: str, event: Any) -> Any:
        with self.lock:
            client = self.client(name)
            self.results.thread, self.results.found = threading.get_ident(), []
            try:
                response = client.post("/", **event)
            finally:
                self.results.thread = None
            if response.status_code >= 300:
                raise RuntimeError(f"HTTP {response.status_code}: {response.get_data(as_text=True)[:500]}")
            if name == self.CLOUD_EVENT:
                return self.results.found[-1] if self.results.found else None
            return response.get_json(silent=True)

    def describe(self, event: Any) -> str:
        headers = event.get("headers", {}) if isinstance(event, dict) else {}
        return str(headers.get("ce-subject") or "a scheduled run")

    def object_created(self, area: str, key: str, size: int) -> None:
        self.invoke(self.CLOUD_EVENT, finalized(self.bucket, key, size))  # one trigger for the whole bucket

    def scheduled_event(self, name: str) -> Any:
        return {"data": "{}", "headers": {"Content-Type": "application/json"}}


class HttpFunction(BackgroundServer):
    """One HTTP function served on loopback by werkzeug, for callers in other processes (the VMs)."""

    name = "cloud-function"

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.app = app

    def make_server(self) -> BaseWSGIServer:
        return make_server(self._host, self._port, self.app, threaded=True)

    @property
    def url(self) -> str:
        return f"http://{self.address}/"
