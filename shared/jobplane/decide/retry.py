"""Retries on errors: the spec's `retry:` (SkyPilot's recover_on_exit_codes, AWS Batch's evaluateOnExit).

The check asks here when an attempt ends in an error one of the spec's triggers names: a rank exited with a
code in `on_exit_codes`, an on-demand VM of the attempt vanished without an exit report (`on_lost`), or the
attempt stalled (`on_stalled`). With retries left, the attempt's VMs are terminated and the job is relaunched
as attempt + 1 (RUNNING or LAUNCHING -> LAUNCHING, claimed by the launcher's CAS), counted in the record's
`retries` and never in its `restarts` (max_restarts stays for preemptions and failed boots). Its agents
restore the newest checkpoint, as after a preemption.

Never retried: an attempt a rank of which stopped on purpose (a stop_on match, a stop request: the uptime
cap's, idle GPUs', a cancel's), one whose idle-GPU flag asked it to stop, one inside its uptime cap's stop
window (the cap asked it to stop, or its VMs' own backstop ended them), and a job past max_wait. A new attempt
would find the stop request still there, and a stop is not an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from jobplane.decide.model import ExitReport, age, attempts_spent, grace_for
from jobplane.decide.rules import Rule
from jobplane.model.bounds import format_duration
from jobplane.model.policy import Policy
from jobplane.model.states import EARLY_STOP

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.jobrecord import JobRecord
    from jobplane.model.spec import JobSpec

STOPPED = frozenset({"stopped", EARLY_STOP})  # exit reasons of a stop on purpose: never an error to retry


class Trigger(StrEnum):
    """Which trigger of the spec's retry: an attempt's error answers."""

    EXIT_CODE = "exit code"
    LOST = "lost"
    STALLED = "stalled"


@dataclass(frozen=True)
class Verdict:
    """Retry the attempt (`number` of `of`), or let its error stand and say why not (`because`)."""

    retry: bool
    number: int = 0
    of: int = 0
    because: str = ""

    def reason(self, why: str, attempt: int) -> str:
        """The action's reason (and so the event's): why the attempt ended, and what came of it."""
        if self.retry:
            return Rule.RETRY.reason(number=self.number, of=self.of, why=why, next=attempt + 1)
        return f"{why}; not retried: {self.because}"


def exit_code(spec: JobSpec, reports: Iterable[ExitReport]) -> ExitReport | None:
    """The lowest rank that exited on its own with a code the spec retries on."""
    codes = set(spec.retry.on_exit_codes) if spec.retry else set()
    return next((e for e in sorted(reports, key=lambda e: e.rank) if e.reason == "exit" and e.code in codes),
                None)


def _wants(spec: JobSpec, trigger: Trigger) -> bool:
    rule = spec.retry
    if rule is None or not rule.max:
        return False
    return {Trigger.EXIT_CODE: bool(rule.on_exit_codes), Trigger.LOST: rule.on_lost,
            Trigger.STALLED: rule.on_stalled}[trigger]


def verdict(record: JobRecord, trigger: Trigger, reports: Iterable[ExitReport], now: datetime, policy: Policy, *,
            stop_asked: bool = False) -> Verdict | None:
    """What comes of an attempt that ended in `trigger`, given its exit reports so far. None: the spec retries
    no such error, or the attempt was stopped on purpose; the error stands as it would without retry:."""
    spec = record.spec
    if not _wants(spec, trigger) or stop_asked or any(e.reason in STOPPED for e in reports):
        return None
    rule = spec.retry
    assert rule is not None  # _wants
    if record.retries >= rule.max:
        return Verdict(False, because=f"no retries left (retry.max {rule.max})")
    if record.attempt >= policy.max_attempts(spec):
        return Verdict(False, because=attempts_spent(record, policy))
    max_wait = policy.max_wait(spec)
    if age(now, record.created_at) > max_wait:
        return Verdict(False, because=f"max_wait {format_duration(max_wait)} exceeded")
    cap = policy.max_runtime(spec)
    if age(now, record.launched_at or record.state_since) >= cap - grace_for(cap, policy):
        return Verdict(False, because=f"attempt {record.attempt} was at its uptime cap ({format_duration(cap)})")
    return Verdict(True, record.retries + 1, rule.max)
