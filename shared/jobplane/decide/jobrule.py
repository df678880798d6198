"""What a rule of the check over a live job is (decide.check.CHECKS lists them): one object that owns its candidate
filter, its decision and, by its place in the list, its precedence; its name and facts (reason, metric, dashboard
panel, risk order) are its decide.rules member. Karpenter's disruption methods are the model: one value per method,
each with its own filter and reason, in one ordered list the controller walks.

A rule reads one of two views of a job. `Listed`: a RUNNING attempt as the listings show it (markers, heartbeats,
limits key, the cloud's VMs), which the candidate filter judges without a GET; a job any filter names has its
record and exit reports read. `Seen`: the job with its record, which the decision judges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.clouds.base import Instance
from jobplane.decide.effects import Relaunch, Terminate
from jobplane.decide.model import Action, ExitReport, Index, Limits, Rule, claim
from jobplane.decide.retry import Trigger, verdict
from jobplane.model.listings import Beat
from jobplane.model.policy import Policy

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.jobrecord import JobRecord


@dataclass(frozen=True)
class Listed:
    """A RUNNING attempt as the listings show it: what a candidate filter reads (no GET)."""

    job_id: str
    attempt: int
    since: datetime  # when its marker was written: it has been RUNNING since
    limits: Limits | None  # its marker's limits (or, for a marker written before, its old limits/ key's; or None)
    beats: list[Beat]  # its heartbeats and output marks
    instances: list[Instance]  # the cloud's listing of its VMs
    index: Index
    now: datetime
    policy: Policy


@dataclass(frozen=True)
class Seen:
    """One LAUNCHING or RUNNING job as this check sees it: what each rule's decision reads."""

    record: JobRecord
    exits: dict[int, ExitReport]  # the attempt's trusted exit reports, by rank
    beats: list[Beat]  # the attempt's heartbeats and output marks
    instances: list[Instance]  # the cloud's listing of the attempt's VMs
    index: Index
    now: datetime
    policy: Policy

    @property
    def stop_asked(self) -> bool:
        """An idle-GPU flag with action stop asked the attempt to stop."""
        return self.policy.idle_gpu.action == "stop" and self.index.flagged_idle(self.record.id, self.record.attempt)

    def retry(self, trigger: Trigger, why: str, reports: Iterable[ExitReport], fail: Action) -> Action:
        """The spec's retry: applied to an attempt's end (decide.retry): `fail` unless the spec retries
        `trigger`; then a retry (the attempt's VMs terminated as `fail` would, and attempt + 1 launched), or
        `fail` saying why it was not retried."""
        record = self.record
        said = verdict(record, trigger, reports, self.now, self.policy, stop_asked=self.stop_asked)
        if said is None:
            return fail
        if not said.retry:
            return replace(fail, reason=said.reason(fail.reason, record.attempt))
        return claim(record, Rule.RETRY, said.reason(why, record.attempt), Terminate(fail.terminate),
                     Relaunch(retry=True))


def never(_: Listed) -> bool:
    """The filter of a rule that never needs a healthy-looking RUNNING job read (it decides on what the other
    filters, an event or the job's state bring in)."""
    return False


@dataclass(frozen=True)
class JobRule:
    """One rule over a live job. `decide` returns its action, or None when it has nothing to say; the first rule
    of the list that says something is the job's action this check. Its action is named `rule`, or one of
    `also`: the spec's retry of the same end (Rule.RETRY), or the other way the same condition ends."""

    rule: Rule
    decide: Callable[[Seen], Action | None]
    candidate: Callable[[Listed], bool] = never  # from listings alone: does a RUNNING job need its record read?
    also: tuple[Rule, ...] = ()
    limits: Callable[[JobRecord, Policy], Mapping[str, int]] | None = None  # the per-job numbers its filter reads
    # (Listed.limits.fact): written into the attempt's RUNNING marker's name when it starts, beside nodes, stall and cap

    @property
    def names(self) -> tuple[Rule, ...]:
        """Every rule name its actions may carry."""
        return (self.rule, *self.also)
