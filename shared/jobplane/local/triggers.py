"""The trigger loop: what the cloud's event routing and schedulers do, done by listing every tick.

Object-created events are found by listing the prefixes the functions act on (queue/, cancels/, preempted-jobs/ and
the live attempts' exit reports and boot failures: only those whose folder the store's counts say changed since the
last tick, jobplane.local.changes) and delivering keys not seen before, in the cloud's own event
shape, to the same functions the cloud runs: on AWS as EventBridge "Object Created" events to the launcher,
rerun or sweeper Lambda handler, as the stack's rules route them; on GCP as Eventarc CloudEvents to the one
bucket-event function, which routes them itself (jobplane.local.cloud_functions). Scheduled functions run every
`schedule` seconds; in an idle cloud (no VM; nothing queued, active, waiting or being cancelled; nothing written since
they last ran and settled) every IDLE_SCHEDULE seconds, as they would find what they found last time. A function
that raises is logged, like a failed invocation, and the next scheduled run catches up, as in the cloud. A paused
function (`jobplane local pause`) gets nothing, as if it were failing.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from jobplane.local import environment_over
from jobplane.local.changes import Look, Watch
from jobplane.model import keys
from jobplane.store.registry import Registry

log = logging.getLogger("local-cloud")  # not under "jobplane": the functions' loggers own that

Result = Callable[[str, Any, Any], None]  # (function, event, what it returned)


def repo_root() -> Path:
    """The checkout holding functions/ (the local cloud runs from a clone, like a deployment does)."""
    return Path(__file__).resolve().parents[3]


class Functions:
    """One cloud's functions as this process runs them: invocations counted, failures logged, pauses honoured.

    What a function writes (its JSON log lines and metric lines) goes to log_stream, as it would go to the
    cloud's log service; on_result hears what each invocation returned.
    """

    names: tuple[str, ...] = ()  # every function
    scheduled: tuple[str, ...] = ()  # those the schedules run, in order

    def __init__(self, log_stream: IO[str] | None = None, on_result: Result | None = None) -> None:
        root = str(repo_root())
        if root not in sys.path:
            sys.path.insert(0, root)
        self.log_stream = log_stream
        self.on_result = on_result
        self.missing: set[str] = set()
        self.paused: set[str] = set()
        self.invocations: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.invoking = threading.RLock()

    def invoke(self, name: str, event: Any) -> Any:
        if name in self.paused:
            return None
        output = contextlib.redirect_stdout(self.log_stream) if self.log_stream else contextlib.nullcontext()
        try:
            # one at a time: the trigger loop and a function URL's threads both invoke, and stdout is global
            with self.invoking, output:  # metric lines are printed
                self.invocations[name] = self.invocations.get(name, 0) + 1
                result = self.call(name, event)
        except Exception as exc:
            self.errors[name] = self.errors.get(name, 0) + 1
            log.error("function %s failed on %s: %s: %s\n%s", name, self.describe(event), type(exc).__name__, exc,
                      traceback.format_exc())
            return None
        if self.on_result is not None:
            self.on_result(name, event, result)
        return result

    def pause(self, name: str, paused: bool) -> list[str]:
        """Stop (or resume) delivering anything to this function; returns the paused ones."""
        if name not in self.names:
            raise LookupError(f"no function {name!r}: the functions here are {', '.join(self.names)}")
        (self.paused.add if paused else self.paused.discard)(name)
        return sorted(self.paused)

    # ---- per cloud ------------------------------------------------------------------------------------
    def call(self, name: str, event: Any) -> Any:
        raise NotImplementedError

    def describe(self, event: Any) -> str:
        raise NotImplementedError

    def object_created(self, area: str, key: str, size: int) -> None:
        """Deliver a new object of this area (queue, cancels, preempted, exits) as the cloud's routing would."""
        raise NotImplementedError

    def scheduled_event(self, name: str) -> Any:
        raise NotImplementedError

    def flush(self) -> None:
        """Deliver the cloud's own events queued since the last tick (EC2's)."""


# ---- AWS: Lambda handlers behind EventBridge -----------------------------------------------------------
@dataclass
class LambdaContext:
    """The attributes Powertools reads from a Lambda context (the local cloud's invocations, and tests')."""

    function_name: str = "jobplane-test"
    aws_request_id: str = "req-1"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:jobplane-test"
    function_version: str = "$LATEST"

    def get_remaining_time_in_millis(self) -> int:
        return 120_000  # the launcher's timeout (infra/aws)


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


def ec2(event: dict[str, Any], region: str) -> dict[str, Any]:
    """An EC2 event (detail-type, source, detail: ec2_runner.state_change / spot_warning) as EventBridge
    delivers it."""
    arn = f"arn:aws:ec2:{region}:123456789012:instance/{event['detail']['instance-id']}"
    return _envelope(event["detail-type"], event["source"], event["detail"], region, [arn])


def scheduled(name: str, region: str) -> dict[str, Any]:
    return _envelope("Scheduled Event", "aws.events", {}, region,
                     [f"arn:aws:events:{region}:123456789012:rule/jobplane-{name}"])


@contextlib.contextmanager
def as_role(credentials: Mapping[str, str]) -> Iterator[None]:
    """The process environment's credentials (and boto3's default session) are these while a function runs
    (invocations are one at a time), as in its own Lambda sandbox; the functions keep a client per access key
    (functions.aws.common), so each function's clients sign as its role."""
    from jobplane.clouds.aws_local import default_session

    with environment_over(credentials), default_session(credentials):
        yield


class LambdaFunctions(Functions):
    """functions.aws.<name>.handler, invoked in this process as Lambda would, with the stack's routes."""

    scheduled = ("launcher", "sweeper", "rerun", "uptime_cap")  # each also has a cron rule
    names = (*scheduled, "vend")  # vend: behind its function URL (jobplane.local.function_url)
    ROUTES = {"queue": "launcher", "cancels": "launcher", "preempted": "rerun", "exits": "sweeper"}  # object-created
    EC2_ROUTES = {  # detail-type -> function
        "EC2 Instance State-change Notification": "sweeper",
        "EC2 Spot Instance Interruption Warning": "rerun",
    }

    def __init__(self, bucket: str, region: str, log_stream: IO[str] | None = None,
                 on_result: Result | None = None,
                 credentials: Callable[[str], Mapping[str, str]] | None = None) -> None:
        super().__init__(log_stream, on_result)
        self.bucket, self.region = bucket, region
        self.credentials = credentials  # function -> its role's session, as Lambda puts it in the environment
        self.handlers: dict[str, Any] = {}
        self.ec2_events: deque[dict[str, Any]] = deque()

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

    def call(self, name: str, event: Any) -> Any:
        handler = self.handler(name)
        if handler is None:
            return None
        arn = f"arn:aws:lambda:{self.region}:123456789012:function:jobplane-{name}"
        with as_role(self.credentials(name) if self.credentials else {}):
            return handler(event, LambdaContext(f"jobplane-{name}", str(uuid.uuid4()), invoked_function_arn=arn))

    def describe(self, event: Any) -> str:
        return str(event.get("detail-type")) if isinstance(event, dict) else repr(event)

    def object_created(self, area: str, key: str, size: int) -> None:
        self.invoke(self.ROUTES[area], object_created(self.bucket, key, size, self.region))

    def scheduled_event(self, name: str) -> Any:
        return scheduled(name, self.region)

    def ec2_event(self, detail: dict[str, Any]) -> None:
        """Called by the instance runner (from its thread) for each EC2 event."""
        self.ec2_events.append(ec2(detail, self.region))

    def flush(self) -> None:
        while self.ec2_events:
            event = self.ec2_events.popleft()
            self.invoke(self.EC2_ROUTES[event["detail-type"]], event)


# ---- the loop ----------------------------------------------------------------------------------------------
IDLE_SCHEDULE = 15.0
# where the scheduled functions find work that time alone may move on: a drop, a cancel or a rerun to retry; a
# capacity wait, a quota line and an after: wait (each a claimed attempt, under active/)
WORK = (keys.QUEUE, keys.CANCELS, keys.PREEMPTED, keys.ACTIVE)


class TriggerLoop:
    def __init__(self, reg: Registry, functions: Functions, schedule: float, bucket: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        """bucket: the registry's, as the counts a tick's Look reads name it."""
        self.clock = clock
        self.reg = reg
        self.functions = functions
        self.schedule = schedule
        self.bucket = bucket
        self.seen: set[tuple[str, datetime]] = set()
        self.last_cron = -math.inf  # the first tick runs them (monotonic() may start near 0, at boot)
        self.attempts: list[tuple[str, int]] | None = None  # the live attempts, as active/ was last listed
        # the counts once the last scheduled runs' writes were made; None: they ran since (or a VM was up), so the
        # next idle look's counts are taken as settled
        self.settled: dict[str, int] | None = None
        self.holding: dict[str, bool] = {}  # whether each WORK folder held anything when it was last listed

    def tick(self, look: Look | None = None, busy: bool = False) -> None:
        """look: what changed since the last tick (None: everything may have); a folder that did not is not listed.
        busy: the cloud has VMs. The caller consumes the look (Look.done) once the tick completed."""
        look = look or Watch().look()
        for prefix, area in ((keys.QUEUE, "queue"), (keys.CANCELS, "cancels"), (keys.PREEMPTED, "preempted")):
            if self._changed(look, prefix):
                self._deliver_new(prefix, area)
        known = set(self.attempts or ())
        if self.attempts is None or self._changed(look, keys.ACTIVE):
            active = self.reg.active()
            self.holding[keys.ACTIVE] = bool(active)
            self.attempts = sorted({(job_id, m.attempt) for job_id, markers in active.items()
                                    for m in markers if m.attempt})
        for job_id, attempt in self.attempts:
            prefix = keys.attempt_prefix(job_id, attempt)
            if (job_id, attempt) not in known or self._changed(look, prefix):  # new: what it holds was never listed
                self._deliver_new(prefix, "exits", suffix=("/exit.json", "/boot-failure.json"))
        self.functions.flush()
        idle = self._idle(look, busy)
        if self.clock() - self.last_cron >= (IDLE_SCHEDULE if idle else self.schedule):
            self.last_cron = self.clock()
            self.settled = None
            for name in self.functions.scheduled:
                self.functions.invoke(name, self.functions.scheduled_event(name))

    def _idle(self, look: Look, busy: bool) -> bool:
        """Whether the scheduled runs would find what they found last time: no VM, nothing under WORK as last listed,
        and the counts as they settled after those runs (their own writes, a repair say, are in the settled counts)."""
        if busy or look.now is None:
            self.settled = None
            return False
        if self.settled is None:
            self.settled = look.now
        return look.now == self.settled and not any(self.holding.get(prefix, True) for prefix in WORK)

    def _changed(self, look: Look, prefix: str) -> bool:
        return look.objects(self.bucket, self.reg.key(prefix))

    def _deliver_new(self, prefix: str, area: str, suffix: str | tuple[str, ...] = "") -> None:
        if prefix in WORK:
            self.holding[prefix] = False
        for key, modified, size in self.reg.listing(prefix):
            if prefix in WORK:
                self.holding[prefix] = True
            if not key.endswith(suffix) or (key, modified) in self.seen:
                continue
            self.seen.add((key, modified))
            self.functions.object_created(area, self.reg.key(key), size)
