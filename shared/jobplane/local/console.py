"""What `jobplane local up` prints for people: one short line per thing that happened to a job or a VM.

The functions' own output (their JSON logs and metric lines) and the runner's details go to the state
directory's functions.log. The terminal gets lines made here, in one place, from what each function
invocation returned (or, for GCP's bucket-event function, logged as its result), from what the instance
runner saw happen to a VM (EC2's events; GCE's boots, preemptions, maxRunDuration, stops and deletes), and
from the local cloud's own warnings:

    11:30:07  launched    demo-1122-113005-ab12 attempt 1: 1 x t3.micro in us-east-1a (i-0abc)
    11:30:12  running     demo-1122-113005-ab12: every rank has sent a heartbeat
    11:30:40  finished    demo-1122-113005-ab12: every rank exited 0
    11:30:41  terminated  i-0abc (demo-1122-113005-ab12 rank 0)

Lines for: launched, booted, running, preempted, rerun, stalled, capped, finished, failed, reaped
(orphans), terminated / stopped / deleted, rejected, waiting (for capacity), refused (safety limits), idle
(GPUs), notified (what the deployment's notification topic received), and warnings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from jobplane.control.reconcile import Result
from jobplane.decide.model import Rule
from jobplane.model import keys
from jobplane.model.jobrecord import JobRecord
from jobplane.views.cost import usd

# Reconciler rules worth a line, by the word a person would use; the others (limits, repairs, cleanups)
# are bookkeeping.
VERBS: dict[str, str] = {
    Rule.STARTED: "running", Rule.FINISHED: "finished", Rule.STOPPED: "capped", Rule.STOP: "capped",
    Rule.TIMED_OUT: "capped", Rule.CAP_NO_JOB: "capped", Rule.ORPHAN: "reaped", Rule.STALLED: "stalled",
    Rule.BOOT_RETRY: "rerun", Rule.BOOT_FAILED: "failed", Rule.LOST_SPOT: "preempted", Rule.LOST: "lost",
    Rule.PREEMPTED: "preempted", Rule.RERUN: "rerun", Rule.RERUN_EXHAUSTED: "failed", Rule.EARLY_STOP: "failed",
    Rule.STOP_PEERS: "stopping", Rule.IDLE: "idle", Rule.IDLE_STOPPED: "stalled", Rule.COST_STOP: "capped",
    Rule.COST_STOPPED: "capped",
}
LAUNCHER_VERBS = {"launched": "launched", "waiting": "waiting", "failed": "failed", "rejected": "rejected",
                  "invalid": "rejected", "duplicate": "rejected"}


def line(verb: str, text: str) -> str:
    return f"{verb:<11} {text}"


def launched_line(job_id: str, record: JobRecord | None) -> str:
    if record is None or not record.instances:
        return line("launched", job_id)
    return line("launched", f"{job_id} attempt {record.attempt}: {len(record.instances)} x {record.instance_type} "
                            f"in {record.zone or 'any zone'} ({', '.join(record.instances)})")


def notified_line(data: dict[str, Any]) -> str:
    """A notification as the topic's subscribers got it, in one line."""
    if data.get("event") == "idle-gpu":
        return line("notified", f"{data.get('job_id')} has idle GPUs: {data.get('reason')}")
    event = str(data.get("event") or "")
    if event.startswith("budget-"):  # an owner's budget: no job, no state
        said = "has spent its budget" if event == "budget-exceeded" else \
            f"has spent {data.get('warn_at_percent', '?')}% of its budget"
        then = f"; {data['then']}" if data.get("then") else ""
        return line("notified", f"{data.get('owner')} {said}: {data.get('figures')}{then}")
    runtime, cost = data.get("runtime_s"), data.get("cost_usd")
    if not isinstance(runtime, int):
        spent = "never launched"
    else:
        spent = f"ran {runtime}s, " + (f"~{usd(cost)} estimated" if isinstance(cost, float | int) else "cost unknown")
    reason = f": {data['reason']}" if data.get("reason") else ""
    return line("notified", f"{data.get('job_id')} {data.get('state')}{reason} ({spent})")


def actions(result: Any) -> list[dict[str, Any]]:
    """The actions of a reconciler's summary ({"actions": [...]})."""
    found = result.get("actions") if isinstance(result, dict) else None
    return [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []


def action_line(action: dict[str, Any]) -> str | None:
    """A line for an applied action worth one, a refused one (safety limits) or a failed one; else None."""
    subject = f"{action['job_id']}: " if action.get("job_id") else ""
    result = action.get("result")
    rule = str(action.get("rule", ""))
    verb = VERBS.get(rule)
    if verb and result == Result.APPLIED:
        return line(verb, f"{subject}{action.get('reason')}")
    if result == Result.REFUSED:
        return line("refused", f"{subject}{rule}: {action.get('reason')} (safety limit)")
    if result == Result.ERROR:
        return line("error", f"{subject}{rule}: {action.get('detail')}")
    return None


def launcher_outcomes(result: Any) -> list[tuple[str, str]]:
    """(job id, outcome) pairs from the launcher's summary ({"outcomes": [...]}) of a drop or a backstop run."""
    found = result.get("outcomes") if isinstance(result, dict) else None
    pairs = []
    for said in found if isinstance(found, list) else []:
        if not isinstance(said, dict):
            continue
        subject = str(said.get("subject") or "")
        drop = keys.parse_drop(subject)
        pairs.append((drop.job_id if drop is not None else subject, str(said.get("result"))))
    return pairs


class Console:
    """Turns invocations and VM events into lines; remembers which job and rank each VM serves."""

    def __init__(self, lookup: Callable[[str], JobRecord | None], write: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.time) -> None:
        self.lookup, self.write, self.clock = lookup, write, clock
        self.serves: dict[str, str] = {}  # instance id -> "job rank n"
        self.lock = threading.Lock()  # the trigger loop and the control endpoint's threads both report

    def invoked(self, function: str, event: Any, result: Any) -> None:
        """What a function returned, or (a bucket-event function on GCP) logged as its result: the launcher's
        outcomes, a reconciler's actions. A failed invocation is logged, and the handler below shows it."""
        for job_id, outcome in launcher_outcomes(result):
            verb = LAUNCHER_VERBS.get(outcome)
            if outcome == "launched":
                self.emit(self._launched(job_id))
            elif verb:
                self.emit(line(verb, f"{job_id}: {self._reason(job_id) or outcome}"))
        for action in actions(result):
            text = action_line(action)
            if text is None:
                continue
            if action.get("rule") in (Rule.RERUN, Rule.BOOT_RETRY) and action.get("job_id"):
                self._remember(self.lookup(str(action["job_id"])))  # the new attempt's instances
            self.emit(text)

    def ec2(self, detail_type: str, detail: dict[str, Any]) -> None:
        """An EC2 event the runner emitted: VMs coming up and going away, Spot reclaiming one."""
        instance_id = str(detail.get("instance-id"))
        state = detail.get("state")
        if detail_type.endswith("State-change Notification") and state in ("running", "terminated", "stopped"):
            self.vm(str(state), instance_id)
        elif detail_type.endswith("Spot Instance Interruption Warning"):
            self.vm("preempted", instance_id, f"Spot interruption warning ({detail.get('instance-action')})")

    def vm(self, what: str, instance_id: str, detail: str = "") -> None:
        """A VM came up (running), was reclaimed (preempted), hit its cloud's own uptime cap (capped) or went
        away (terminated, stopped, deleted)."""
        verb = {"running": "booted"}.get(what, what)
        self.emit(line(verb, self._instance(instance_id) + (f": {detail}" if detail else "")))

    def _launched(self, job_id: str) -> str:
        record = self.lookup(job_id)
        self._remember(record)
        return launched_line(job_id, record)

    def _remember(self, record: JobRecord | None) -> None:
        if record is not None:
            for rank, iid in enumerate(record.instances):
                self.serves[iid] = f"{record.id} rank {rank}"

    def _reason(self, job_id: str) -> str | None:
        record = self.lookup(job_id)
        return record.reason if record else None

    def _instance(self, instance_id: str) -> str:
        serves = self.serves.get(instance_id)
        return f"{instance_id} ({serves})" if serves else instance_id

    def emit(self, text: str) -> None:
        with self.lock:
            self.write(f"{time.strftime('%H:%M:%S', time.localtime(self.clock()))}  {text}")


class ConsoleHandler(logging.Handler):
    """The local cloud's own warnings and errors (a refused instance, a failed invocation) as one line each;
    the full record, traceback included, is in functions.log."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        first, _, more = record.getMessage().partition("\n")
        verb = "error" if record.levelno >= logging.ERROR else "warning"
        self.console.emit(line(verb, first + (" (details in functions.log)" if more or record.exc_info else "")))
