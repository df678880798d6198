"""The trigger loop: what EventBridge rules and schedules do in the cloud, done by listing every tick.

Object-created events are found by listing the prefixes the functions subscribe to and delivering keys
not seen before, in EventBridge's shape, to the same handler functions the Lambdas run. EC2 events come
from the instance runner. Scheduled functions run every `schedule` seconds. A handler that is not
written yet (another step of the build) is skipped; a handler that raises is logged, like a failed
invocation, and the next scheduled run catches up, as in the cloud.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from jobplane import keys
from jobplane.registry import Registry

log = logging.getLogger("local-cloud")  # not under "jobplane": the functions' Powertools Logger owns that

SCHEDULED = ("launcher", "sweeper", "rerun", "uptime_cap")  # the cron rules of the AWS stack
EC2_ROUTES = {  # detail-type -> function, as the stack's EventBridge rules route them
    "EC2 Instance State-change Notification": "sweeper",
    "EC2 Spot Instance Interruption Warning": "rerun",
}


@dataclass
class LambdaContext:
    """The attributes Powertools reads from a Lambda context."""

    function_name: str
    aws_request_id: str
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = ""
    function_version: str = "$LATEST"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def _envelope(detail_type: str, source: str, detail: dict[str, Any], region: str,
              resources: list[str] | None = None) -> dict[str, Any]:
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": detail_type, "source": source,
            "account": "123456789012", "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": region, "resources": resources or [], "detail": detail}


def object_created(bucket: str, key: str, size: int, region: str) -> dict[str, Any]:
    return _envelope("Object Created", "aws.s3", {
        "version": "0", "bucket": {"name": bucket}, "object": {"key": key, "size": size},
        "request-id": uuid.uuid4().hex, "requester": "123456789012", "reason": "PutObject"},
        region, [f"arn:aws:s3:::{bucket}"])


def scheduled(name: str, region: str) -> dict[str, Any]:
    return _envelope("Scheduled Event", "aws.events", {}, region,
                     [f"arn:aws:events:{region}:123456789012:rule/jobplane-{name}"])


def repo_root() -> Path:
    """The checkout holding functions/ (the local cloud runs from a clone, like `cdk deploy` does)."""
    return Path(__file__).resolve().parents[3]


Result = Callable[[str, dict[str, Any], Any], None]  # (function, event, what it returned)


class Functions:
    """Invokes functions.aws.<name>.handler in this process, as Lambda would.

    What a function writes (Powertools' JSON log lines, EMF metric lines) goes to log_stream, as a
    Lambda's goes to CloudWatch Logs; on_result hears what each invocation returned.
    """

    def __init__(self, log_stream: IO[str] | None = None, on_result: Result | None = None) -> None:
        root = str(repo_root())
        if root not in sys.path:
            sys.path.insert(0, root)
        self.log_stream = log_stream
        self.on_result = on_result
        self.handlers: dict[str, Any] = {}
        self.missing: set[str] = set()
        self.invocations: dict[str, int] = {}
        self.errors: dict[str, int] = {}

    def handler(self, name: str) -> Any:
        if name in self.handlers or name in self.missing:
            return self.handlers.get(name)
        module = f"functions.aws.{name}"
        try:
            self.handlers[name] = importlib.import_module(module).handler
        except ModuleNotFoundError as exc:
            if exc.name not in (module, "functions.aws"):
                raise
            self.missing.add(name)
            log.warning("function %s is not there yet: its events are not delivered", name)
        self._route_logs()
        return self.handlers.get(name)

    def _route_logs(self) -> None:
        """Point the functions' logger (Powertools' handler on "jobplane", made on import) at log_stream."""
        if self.log_stream is None:
            return
        for handler in logging.getLogger("jobplane").handlers:
            if type(handler) is logging.StreamHandler and handler.stream is not self.log_stream:
                handler.setStream(self.log_stream)

    def invoke(self, name: str, event: dict[str, Any]) -> Any:
        handler = self.handler(name)
        if handler is None:
            return None
        self.invocations[name] = self.invocations.get(name, 0) + 1
        context = LambdaContext(f"jobplane-{name}", str(uuid.uuid4()),
                                invoked_function_arn=f"arn:aws:lambda:us-east-1:123456789012:function:jobplane-{name}")
        output = contextlib.redirect_stdout(self.log_stream) if self.log_stream else contextlib.nullcontext()
        try:
            with output:  # EMF metric lines are printed
                result = handler(event, context)
        except Exception as exc:
            self.errors[name] = self.errors.get(name, 0) + 1
            log.error("function %s failed on %s: %s: %s\n%s", name, event.get("detail-type"), type(exc).__name__,
                      exc, traceback.format_exc())
            return None
        if self.on_result is not None:
            self.on_result(name, event, result)
        return result


class TriggerLoop:
    def __init__(self, reg: Registry, bucket: str, region: str, functions: Functions, schedule: float) -> None:
        self.reg, self.bucket, self.region = reg, bucket, region
        self.functions = functions
        self.schedule = schedule
        self.seen: set[tuple[str, datetime]] = set()
        self.ec2_events: deque[dict[str, Any]] = deque()
        self.last_cron = 0.0

    def ec2_event(self, detail: dict[str, Any]) -> None:
        """Called by the instance runner (from its thread) for each EC2 event."""
        self.ec2_events.append(_envelope(detail["detail-type"], detail["source"], detail["detail"], self.region))

    def tick(self) -> None:
        self._deliver_new(keys.QUEUE, "launcher")
        self._deliver_new(keys.PREEMPTED, "rerun")
        for job_id, markers in self.reg.active().items():
            for attempt in {m.attempt for m in markers if m.attempt}:
                self._deliver_new(keys.attempt_prefix(job_id, attempt), "sweeper",
                                  suffix=("/exit.json", "/boot-failure.json"))
        while self.ec2_events:
            event = self.ec2_events.popleft()
            self.functions.invoke(EC2_ROUTES[event["detail-type"]], event)
        if time.monotonic() - self.last_cron >= self.schedule:
            self.last_cron = time.monotonic()
            for name in SCHEDULED:
                self.functions.invoke(name, scheduled(name, self.region))

    def _deliver_new(self, prefix: str, function: str, suffix: str | tuple[str, ...] = "") -> None:
        for key, modified, size in self.reg.listing(prefix):
            if not key.endswith(suffix) or (key, modified) in self.seen:
                continue
            self.seen.add((key, modified))
            self.functions.invoke(function, object_created(self.bucket, self.reg.key(key), size, self.region))
