"""Plain data the reconcilers decide on (Snapshot) and return (Action). No I/O here."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from jobplane.clouds.base import Instance
from jobplane.decide.effects import ORDER, Effect, Flag, Note, Terminate, Transition
from jobplane.decide.rules import Rule as Rule  # the rules and their table (decide.rules), named from here too
from jobplane.model import keys
from jobplane.model.keys import Held as Held  # the parsed held-until key, part of a Snapshot
from jobplane.model.keys import Limits as Limits  # a RUNNING marker's limits (or an old limits/ key's)
from jobplane.model.listings import ActiveMarker, Beat, IdleMark
from jobplane.model.policy import Policy
from jobplane.model.states import State

if TYPE_CHECKING:
    from jobplane.model import records  # the records' models: a run that decides nothing never imports them
    from jobplane.model.jobrecord import JobRecord  # the registry builds records: a run that lists only never does

ALIVE = frozenset({"pending", "running"})  # an instance in any other state is gone or going


@dataclass(frozen=True)
class ExitReport:
    """attempts/<n>/nodes/<rank>/exit.json as the agent wrote it (jobplane.model.records.ExitReport), with its rank."""

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
    """preempted-jobs/<id>: the agent's (or the check's) note that an attempt lost its Spot capacity."""

    job_id: str
    at: datetime
    attempt: int | None = None
    instance_id: str | None = None
    problem: str | None = None  # why its body could not be read, if it could not
    size: int = 0  # its body's bytes, as the listing gave them: one over the bound is never read (control.facts)


@dataclass(frozen=True)
class Ignored:
    """A fact of a job's current attempt the functions do not act on: it does not parse, or it names no
    instance of the attempt; or, keyed by the attempt's prefix, what the attempt holds beyond what a check reads."""

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
    (active/, heartbeats/; preempted-jobs/ when a job is read or PREEMPTED; limits/ only while `needs_old_limits`) and
    one paginated managed-instance listing; records, exit reports and boot failures are fetched only for the jobs
    `check.candidates` names.
    """

    active: Mapping[str, tuple[ActiveMarker, ...]] = field(default_factory=dict)
    beats: tuple[Beat, ...] = ()
    limits: tuple[Limits, ...] = ()  # old limits/ keys, for RUNNING markers written before they carried their own
    instances: tuple[Instance, ...] = ()
    preempted: Mapping[str, PreemptedMark] = field(default_factory=dict)
    records: Mapping[str, JobRecord] = field(default_factory=dict)
    exits: Mapping[str, tuple[ExitReport, ...]] = field(default_factory=dict)  # record's current attempt
    boot_failures: Mapping[str, str] = field(default_factory=dict)  # job -> what a VM's bootstrap reported
    unreadable: Mapping[str, tuple[Ignored, ...]] = field(default_factory=dict)  # facts that do not parse, or not read
    noted: frozenset[str] = frozenset()  # ignored-fact flags already created (the attempts' listings)
    forced: frozenset[str] = frozenset()  # jobs an event asked about: always looked at closely
    idle: tuple[IdleMark, ...] = ()  # ranks whose GPUs sat idle (heartbeats listing)
    idle_flags: frozenset[tuple[str, int]] = frozenset()  # (job, attempt) flagged idle already (active/ listing)
    old_idle_flags: frozenset[tuple[str, int]] = frozenset()  # ... flagged under limits/ (written before)
    unreadable_records: frozenset[str] = frozenset()  # jobs whose job.json does not parse: left alone this run
    held: tuple[Held, ...] = ()  # FAILED attempts whose VMs a debug hold keeps (active/ listing; old: limits/)


def needs_old_limits(snap: Snapshot) -> bool:
    """Whether a run must list limits/, where the limits, idle flags and held-until keys were written before they
    moved under active/: while a RUNNING marker carries no limits (written before), or a VM no live marker and no
    held-until key explains (an orphan, or an attempt an old held-until key keeps). A healthy registry: never."""
    if any(m.state == State.RUNNING and m.limits is None for ms in snap.active.values() for m in ms):
        return True
    explained = {(m.job_id, m.attempt) for ms in snap.active.values() for m in ms} | \
        {(h.job_id, h.attempt) for h in snap.held}
    return any((i.job_id, i.attempt) not in explained for i in snap.instances
               if i.managed and i.state not in ("terminated", "shutting-down"))


# An idle mark is current when written with its rank's newest heartbeat (the agent writes it just after):
# LastModified has one-second resolution, hence the slack.
IDLE_SLACK_S = 2


class Index:
    """The snapshot's listings grouped by (job, attempt)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.beats: defaultdict[tuple[str, int], list[Beat]] = defaultdict(list)
        for b in snap.beats:
            self.beats[b.job_id, b.attempt].append(b)
        self.instances: defaultdict[tuple[str | None, int | None], list[Instance]] = defaultdict(list)
        for i in snap.instances:
            self.instances[i.job_id, i.attempt].append(i)
        # a RUNNING marker's own limits, else (a marker written before) its attempt's old limits/ key
        self.marked = {(m.job_id, m.attempt): m.limits for ms in snap.active.values() for m in ms if m.limits}
        self.limits = {**{(lim.job_id, lim.attempt): lim for lim in snap.limits}, **self.marked}
        self.idle: defaultdict[tuple[str, int], list[IdleMark]] = defaultdict(list)
        for mark in snap.idle:
            self.idle[mark.job_id, mark.attempt].append(mark)

    def flagged_idle(self, job_id: str, attempt: int) -> bool:
        return (job_id, attempt) in self.snap.idle_flags or (job_id, attempt) in self.snap.old_idle_flags

    def idle_everywhere(self, job_id: str, attempt: int, nodes: int) -> bool:
        """Every rank's newest heartbeat came with an idle mark: its mean GPU use over the window was low."""
        for rank in range(nodes):
            marks = [m.at for m in self.idle[job_id, attempt] if m.rank == rank]
            beats = [b.at for b in self.beats[job_id, attempt] if b.rank == rank and not b.output]
            if not marks or not beats or age(max(beats), max(marks)) > IDLE_SLACK_S:
                return False
        return True

    def current_attempt(self, job_id: str | None) -> int | None:
        """The attempt whose instances may live: the record's if fetched, else the newest marker's."""
        if job_id is None:
            return None
        record = self.snap.records.get(job_id)
        if record is not None:
            return None if record.terminal else record.attempt
        markers = self.snap.active.get(job_id)
        return max(m.attempt for m in markers) if markers else None


E = TypeVar("E", bound=Effect)


@dataclass(frozen=True)
class Action:
    """One decision about one job (or one jobless instance): its rule, its reason and its effects, which the
    applier runs in effects.ORDER. `expect` and `expect_attempt` are what the run saw of the job: its transition
    is a CAS on them, and its relaunch, resume and saved consoles are of that attempt."""

    rule: Rule
    job_id: str | None
    reason: str
    effects: tuple[Effect, ...] = ()
    expect: frozenset[State] = frozenset()
    expect_attempt: int | None = None
    refused: str | None = None  # why the safety limits refused it; a refused action is only reported

    def __post_init__(self) -> None:
        object.__setattr__(self, "effects", tuple(sorted(self.effects, key=lambda e: ORDER.index(type(e)))))

    def refuse(self, why: str) -> Action:
        return replace(self, refused=why)

    def get(self, kind: type[E]) -> E | None:
        """The action's effect of this kind, if it has one."""
        return next((e for e in self.effects if isinstance(e, kind)), None)

    @property
    def to(self) -> State | None:
        """The state its transition moves the job to, if it has one."""
        transition = self.get(Transition)
        return transition.to if transition else None

    @property
    def terminate(self) -> tuple[str, ...]:
        """The instances it terminates (what the blast-radius limit counts)."""
        terminate = self.get(Terminate)
        return terminate.instances if terminate else ()

    @property
    def relaunch_expect(self) -> frozenset[State]:
        """What a relaunch claims the job from: the state its transition left, else the one the run saw."""
        return frozenset({self.to}) if self.to else self.expect


def claim(record: JobRecord, rule: Rule, reason: str, *effects: Effect) -> Action:
    """An action on a job as this run saw it: applied only if its state and attempt are still what we saw."""
    return Action(rule, record.id, reason, effects, expect=frozenset({record.state}), expect_attempt=record.attempt)


def ignored_event(attempt: int, fact: Ignored) -> Note:
    """The job event saying a fact was ignored, and why."""
    from jobplane.model import history  # the events: with the record's models, which a run loads when it reads one

    return Note(history.IgnoredFact(attempt=attempt, key=fact.key, why=fact.why))


def ignore(job_id: str, attempt: int, fact: Ignored) -> Action:
    """Record once (the flag) that this run ignored a fact of the attempt, and why."""
    return Action(Rule.IGNORED, job_id, Rule.IGNORED.reason(fact=fact.key, why=fact.why),
                  (Flag(keys.ignored_flag(job_id, attempt, fact.key)), ignored_event(attempt, fact)))


def alive(instance: Instance) -> bool:
    return instance.state in ALIVE


def age(now: datetime, then: datetime) -> float:
    return (now - then).total_seconds()


def attempts_spent(record: JobRecord, policy: Policy) -> str:
    """Why no attempt follows this one when the policy's ceiling on attempts is what stops it (rerun, retry, a
    failed boot); the spec's own max_restarts and retry.max are checked, and said, first."""
    return f"attempt {record.attempt} was the last the policy allows (max_attempts_per_job " \
           f"{policy.max_attempts_per_job})"


def grace_for(cap: int, policy: Policy) -> int:
    """How long before an attempt's uptime cap its agents are asked to stop (decide.uptime)."""
    return min(policy.safety.stop_grace, cap // 10)
