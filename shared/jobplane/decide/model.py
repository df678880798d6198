"""Plain data the reconcilers decide on (Snapshot) and return (Action). No I/O here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from jobplane import keys, records
from jobplane.clouds.base import Instance, Notice
from jobplane.decide.rules import Rule as Rule  # the rules and their table (decide.rules), named from here too
from jobplane.keys import Limits as Limits  # the parsed limits/ key, part of a Snapshot
from jobplane.policy import Policy
from jobplane.registry import ActiveMarker, Beat, IdleMark, JobRecord
from jobplane.states import State

ALIVE = frozenset({"pending", "running"})  # an instance in any other state is gone or going


@dataclass(frozen=True)
class ExitReport:
    """attempts/<n>/nodes/<rank>/exit.json as the agent wrote it (jobplane.records.ExitReport), with its rank."""

    rank: int
    code: int  # -1 when the report has none (the node stood down before running anything)
    reason: str = "exit"  # exit | preempted | stopped | early-stop (a stop_on rule matched)
    error: str | None = None  # what the agent says went wrong (requirements.txt, its own failure, the stop_on match)
    stopped_by: str | None = None  # reason "stopped": who asked (the stop request's `by`: uptime-cap, idle-gpu)
    stop_reason: str | None = None
    instance_id: str | None = None  # the VM that wrote it: trusted only if it is one of the attempt's

    @classmethod
    def of(cls, rank: int, report: records.ExitReport) -> ExitReport:
        return cls(rank, -1 if report.code is None else report.code, report.reason, report.error, report.stopped_by,
                   report.stop_reason, report.instance_id)


@dataclass(frozen=True)
class PreemptedMark:
    """preempted-jobs/<id>: the agent's (or the sweeper's) note that an attempt lost its Spot capacity."""

    job_id: str
    at: datetime
    attempt: int | None = None
    instance_id: str | None = None
    problem: str | None = None  # why its body could not be read, if it could not


@dataclass(frozen=True)
class Ignored:
    """A fact of a job's current attempt the functions do not act on: it does not parse, or it names no
    instance of the attempt."""

    key: str
    why: str


def attempt_instances(record: JobRecord, instances: Iterable[Instance]) -> frozenset[str]:
    """The instances a fact of the record's current attempt may come from: those the cloud returned at launch
    (job.json keeps them, so a VM already gone from the listing still counts) and the cloud's own listing of
    the attempt's VMs."""
    return frozenset(record.instances) | {i.id for i in instances
                                          if i.job_id == record.id and i.attempt == record.attempt}


def trusted_mark(mark: PreemptedMark, record: JobRecord, instances: Iterable[Instance]) -> bool:
    """A preempted marker names the record's attempt and one of its instances."""
    return mark.attempt == record.attempt and mark.instance_id in attempt_instances(record, instances)


@dataclass(frozen=True)
class Snapshot:
    """What one reconciler run sees.

    Everything except `records`, `exits`, `boot_failures`, `unreadable` and `preempted` bodies comes from listings
    (active/, heartbeats/, limits/, preempted-jobs/) and one paginated managed-instance listing; records,
    exit reports and boot failures are fetched only for the jobs `sweep.candidates` names.
    """

    active: Mapping[str, tuple[ActiveMarker, ...]] = field(default_factory=dict)
    beats: tuple[Beat, ...] = ()
    limits: tuple[Limits, ...] = ()
    instances: tuple[Instance, ...] = ()
    preempted: Mapping[str, PreemptedMark] = field(default_factory=dict)
    records: Mapping[str, JobRecord] = field(default_factory=dict)
    exits: Mapping[str, tuple[ExitReport, ...]] = field(default_factory=dict)  # record's current attempt
    boot_failures: Mapping[str, str] = field(default_factory=dict)  # job -> what a VM's bootstrap reported
    unreadable: Mapping[str, tuple[Ignored, ...]] = field(default_factory=dict)  # facts that do not parse
    noted: frozenset[str] = frozenset()  # ignored-fact flags already created (the attempts' listings)
    forced: frozenset[str] = frozenset()  # jobs an event asked about: always looked at closely
    idle: tuple[IdleMark, ...] = ()  # ranks whose GPUs sat idle (heartbeats listing)
    idle_flags: frozenset[tuple[str, int]] = frozenset()  # (job, attempt) flagged idle already (limits listing)
    unreadable_records: frozenset[str] = frozenset()  # jobs whose job.json does not parse: left alone this run


@dataclass(frozen=True)
class Action:
    """One decision about one job (or one jobless instance). The applier runs the parts in this order:

    transition (CAS with expect/expect_attempt; if refused, the rest is skipped: another run acted), create
    the flag key (create-only; if it exists, the rest is skipped: another run flagged it), record the event,
    publish the notice, repair markers, save the console output of VMs whose agent never started (before
    they go), terminate, mark preempted, write limits, stop request, relaunch, clear the preempted marker,
    delete keys.
    """

    rule: Rule
    job_id: str | None
    reason: str
    to: State | None = None
    expect: frozenset[State] = frozenset()
    expect_attempt: int | None = None
    updates: Mapping[str, Any] = field(default_factory=dict)  # extra job.json fields with the transition
    flag: str | None = None  # a key created once: the run that creates it does the rest
    event: tuple[str, Mapping[str, Any]] | None = None  # (kind, body) added to the job's history
    notice: Notice | None = None  # published to the deployment's notification topic
    repair: bool = False
    save_console: tuple[tuple[int, str], ...] = ()  # (rank, instance id) of expect_attempt
    terminate: tuple[str, ...] = ()
    mark_preempted: records.PreemptedMarker | None = None
    write_limits: Limits | None = None
    stop: bool = False
    stop_by: str = "uptime-cap"  # the stop request's `by`, which the agent copies into its exit report
    relaunch: bool = False  # launcher.launch_attempt(expect={to} or expect, expect_attempt)
    retry: bool = False  # the relaunch retries an error: counted in the record's retries, not its restarts
    resume_from: str | None = None  # launcher.resume from the record with this event stamp (its launcher died)
    clear_preempted: bool = False
    delete_keys: tuple[str, ...] = ()
    refused: str | None = None  # why the safety limits refused it; a refused action is only reported

    def refuse(self, why: str) -> Action:
        return replace(self, refused=why)

    @property
    def relaunch_expect(self) -> frozenset[State]:
        return frozenset({self.to}) if self.to else self.expect


def claim(record: JobRecord, rule: Rule, reason: str, **parts: Any) -> Action:
    """An action on a job as this run saw it: applied only if its state and attempt are still what we saw."""
    return Action(rule, record.id, reason, expect=frozenset({record.state}), expect_attempt=record.attempt, **parts)


def ignored_event(attempt: int, fact: Ignored) -> tuple[str, Mapping[str, Any]]:
    """The job event saying a fact was ignored, and why."""
    return "ignored-fact", {"attempt": attempt, "key": fact.key, "why": fact.why}


def ignore(job_id: str, attempt: int, fact: Ignored) -> Action:
    """Record once (the flag) that this run ignored a fact of the attempt, and why."""
    return Action(Rule.IGNORED, job_id, Rule.IGNORED.reason(fact=fact.key, why=fact.why),
                  flag=keys.ignored_flag(job_id, attempt, fact.key), event=ignored_event(attempt, fact))


def alive(instance: Instance) -> bool:
    return instance.state in ALIVE


def age(now: datetime, then: datetime) -> float:
    return (now - then).total_seconds()


def grace_for(cap: int, policy: Policy) -> int:
    """How long before an attempt's uptime cap its agents are asked to stop (decide.uptime)."""
    return min(policy.safety.stop_grace, cap // 10)
