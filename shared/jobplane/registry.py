"""The job registry over any ObjectStore: records, CAS transitions, events and markers (docs/architecture.md).

Only control functions write job.json, always by compare-and-swap; a lost race re-reads and re-checks
the transition, so two overlapping functions can never both act on one state.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jobplane import keys
from jobplane.clouds.base import NotFound, ObjectStore, PreconditionFailed
from jobplane.policy import DEFAULT_POLICY, Policy, parse_policy
from jobplane.spec import JobSpec
from jobplane.states import LIVE, TERMINAL, State, allowed
from jobplane.usage import AttemptUsage, close

CAS_RETRIES = 20
log = logging.getLogger("jobplane.registry")


class RegistryError(Exception):
    pass


class JobExists(RegistryError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} already exists: job ids are never reused")
        self.job_id = job_id


class JobNotFound(RegistryError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r}")
        self.job_id = job_id


class TransitionRefused(RegistryError):
    """The transition is not in the table, or the job moved on since the caller looked."""

    def __init__(self, job_id: str, src: State, dst: State, why: str = "not an allowed transition") -> None:
        super().__init__(f"job {job_id}: {src} -> {dst} refused: {why}")
        self.job_id, self.src, self.dst = job_id, src, dst


class JobRecord(BaseModel):
    """jobs/<id>/job.json."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    spec: JobSpec
    state: State
    attempt: int = 0  # 0 until the first launch
    restarts: int = 0  # attempts after the first
    owner: str = "default"
    created_at: datetime
    updated_at: datetime
    state_since: datetime
    first_launched_at: datetime | None = None
    launched_at: datetime | None = None  # current attempt
    instances: list[str] = Field(default_factory=list)  # current attempt, by rank
    instance_type: str | None = None
    zone: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    wait_until: datetime | None = None  # WAITING_CAPACITY: earliest next try
    waits: int = 0  # consecutive failed tries, for the backoff
    last_error: str | None = None
    notices: list[dict[str, Any]] = Field(default_factory=list)  # Spot interruption warnings seen
    usage: list[AttemptUsage] = Field(default_factory=list)  # what each launched attempt ran on (jobplane.cost)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass(frozen=True)
class ActiveMarker:
    job_id: str
    state: State
    attempt: int
    since: datetime  # the marker's LastModified: when the job entered this state


@dataclass(frozen=True)
class Beat:
    """One heartbeat object seen in the listing: liveness (or last output) of one rank."""

    job_id: str
    attempt: int
    rank: int
    output: bool  # True for the `.output` mark (last time the user process printed)
    at: datetime


@dataclass(frozen=True)
class IdleMark:
    """A rank's `.idle` mark in the heartbeats listing: its GPUs were idle over the policy window as of `at`."""

    job_id: str
    attempt: int
    rank: int
    at: datetime


def backoff(tries: int) -> None:
    """Full-jitter exponential backoff: contending writers spread apart so a hot record converges."""
    time.sleep(random.uniform(0, min(1.0, 0.01 * 2**tries)))


def utcnow() -> datetime:
    return datetime.now(UTC)


def stamp(now: datetime) -> str:
    """Sortable, unique-enough event stamp: 20261122T050421.123456Z-ab12."""
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ") + "-" + secrets.token_hex(2)


def _dump(model: BaseModel) -> bytes:
    return model.model_dump_json(exclude_none=True, indent=1).encode()


# Told of every transition this process made (old record, new record), after its CAS won: exactly one
# caller hears of each transition, however many reconcilers raced for it (jobplane.notify listens).
TransitionListener = Callable[["JobRecord", "JobRecord"], None]


class Registry:
    """Typed access to one registry (a bucket plus an optional root prefix)."""

    def __init__(self, store: ObjectStore, root: str = "", listeners: Sequence[TransitionListener] = ()) -> None:
        self.store = store
        self.root = root.strip("/") + "/" if root.strip("/") else ""
        self.listeners = list(listeners)

    def key(self, key: str) -> str:
        return self.root + key

    def _unroot(self, key: str) -> str:
        return key[len(self.root):]

    # ---- raw helpers -------------------------------------------------------------------------------
    def get_bytes(self, key: str) -> bytes:
        return self.store.get(self.key(key)).data

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def put_json(self, key: str, body: Any) -> None:
        self.store.put(self.key(key), json.dumps(body, indent=1, default=str).encode(), "application/json")

    def listing(self, prefix: str, page_size: int = 1000) -> Iterator[tuple[str, datetime, int]]:
        for info in self.store.list(self.key(prefix), page_size):
            yield self._unroot(info.key), info.last_modified, info.size

    def delete(self, key: str) -> None:
        self.store.delete(self.key(key))

    def policy(self) -> Policy:
        """config/policy.yaml, or the defaults when it is absent."""
        try:
            return parse_policy(self.get_bytes(keys.POLICY))
        except NotFound:
            return DEFAULT_POLICY

    # ---- records -----------------------------------------------------------------------------------
    def create_job(self, job_id: str, spec: JobSpec, now: datetime | None = None) -> JobRecord:
        """Create-only: a second create of the same id raises JobExists and changes nothing."""
        now = now or utcnow()
        spec = spec if spec.id == job_id else spec.model_copy(update={"id": job_id})
        record = JobRecord(id=job_id, spec=spec, state=State.QUEUED, owner=spec.owner,
                           created_at=now, updated_at=now, state_since=now)
        try:
            self.store.put_if_absent(self.key(keys.job_record(job_id)), _dump(record))
        except PreconditionFailed:
            raise JobExists(job_id) from None
        self._event(job_id, now, "created", {"state": State.QUEUED, "spec": spec.model_dump(mode="json")})
        self._move_marker(job_id, None, record)
        return record

    def get(self, job_id: str) -> tuple[JobRecord, str]:
        try:
            blob = self.store.get(self.key(keys.job_record(job_id)))
        except NotFound:
            raise JobNotFound(job_id) from None
        return JobRecord.model_validate_json(blob.data), blob.version

    def job(self, job_id: str) -> JobRecord:
        return self.get(job_id)[0]

    def exists(self, job_id: str) -> bool:
        try:
            self.store.get(self.key(keys.job_record(job_id)))
            return True
        except NotFound:
            return False

    def transition(
        self,
        job_id: str,
        to: State,
        *,
        now: datetime | None = None,
        reason: str | None = None,
        expect: Collection[State] | None = None,
        expect_attempt: int | None = None,
        event: dict[str, Any] | None = None,
        **updates: Any,
    ) -> JobRecord:
        """Move a job to `to` by compare-and-swap, retrying on conflict.

        expect / expect_attempt say what the caller saw; if the job has moved on (another function won
        the race), the transition is refused instead of being applied twice.
        """
        now = now or utcnow()
        for tries in range(CAS_RETRIES):
            current, version = self.get(job_id)
            if expect is not None and current.state not in expect:
                raise TransitionRefused(job_id, current.state, to, f"state is {current.state}, expected "
                                        + "/".join(sorted(expect)))
            if expect_attempt is not None and current.attempt != expect_attempt:
                raise TransitionRefused(job_id, current.state, to,
                                        f"attempt is {current.attempt}, expected {expect_attempt}")
            if not allowed(current.state, to):
                raise TransitionRefused(job_id, current.state, to)
            fields: dict[str, Any] = {"state": to, "updated_at": now, "reason": reason, **updates}
            if to != current.state or fields.get("attempt", current.attempt) != current.attempt:
                fields["state_since"] = now
            new = JobRecord.model_validate({**current.model_dump(), **fields})
            if any(u.open for u in new.usage):  # leaving an attempt ends its instances' billed time
                keep = new.attempt if new.state in (State.LAUNCHING, State.RUNNING) else None
                new = new.model_copy(update={"usage": close(new.usage, keep, now)})
            try:
                self.store.put_if_match(self.key(keys.job_record(job_id)), _dump(new), version)
            except PreconditionFailed:
                backoff(tries + 1)
                continue
            body = {"from": current.state, "to": to, "attempt": new.attempt, "reason": reason, **(event or {})}
            self._event(job_id, now, to.lower().replace("_", "-"), body)
            self._move_marker(job_id, current, new)
            self._tell(current, new)
            return new
        raise RegistryError(f"job {job_id}: gave up after {CAS_RETRIES} conflicting writes")

    def _tell(self, old: JobRecord, new: JobRecord) -> None:
        for listener in self.listeners:
            try:
                listener(old, new)
            except Exception:  # a listener (a notification) must never undo or repeat a transition
                log.exception("transition listener failed for %s", new.id, extra={"job_id": new.id})

    def update(self, job_id: str, *, now: datetime | None = None, **updates: Any) -> JobRecord:
        """CAS-update fields without a state change (e.g. recording a Spot warning)."""
        now = now or utcnow()
        for tries in range(CAS_RETRIES):
            current, version = self.get(job_id)
            new = JobRecord.model_validate({**current.model_dump(), "updated_at": now, **updates})
            try:
                self.store.put_if_match(self.key(keys.job_record(job_id)), _dump(new), version)
                return new
            except PreconditionFailed:
                backoff(tries + 1)
        raise RegistryError(f"job {job_id}: gave up after {CAS_RETRIES} conflicting writes")

    # ---- events ------------------------------------------------------------------------------------
    def _event(self, job_id: str, now: datetime, kind: str, body: dict[str, Any]) -> None:
        self.put_json(keys.event(job_id, stamp(now), kind), {"time": now.isoformat(), "kind": kind, **body})

    def record_event(self, job_id: str, kind: str, body: dict[str, Any], now: datetime | None = None) -> None:
        self._event(job_id, now or utcnow(), kind, body)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return [self.get_json(k) for k, _, _ in self.listing(keys.events_prefix(job_id))]

    # ---- active markers ----------------------------------------------------------------------------
    def _move_marker(self, job_id: str, old: JobRecord | None, new: JobRecord) -> None:
        new_key = keys.active_marker(job_id, new.state, new.attempt)
        if new.state in LIVE:
            self.store.put(self.key(new_key), b"", "text/plain")
        if old is not None:
            old_key = keys.active_marker(job_id, old.state, old.attempt)
            if old_key != new_key or new.state not in LIVE:
                self.delete(old_key)

    def repair_markers(self, job_id: str) -> None:
        """Make active/<id>/ match job.json again (after a function died between the two writes)."""
        record = self.job(job_id)
        want = keys.active_marker(job_id, record.state, record.attempt) if record.state in LIVE else None
        have = [k for k, _, _ in self.listing(keys.active_prefix(job_id))]
        for k in have:
            if k != want:
                self.delete(k)
        if want and want not in have:
            self.store.put(self.key(want), b"", "text/plain")

    def active(self) -> dict[str, list[ActiveMarker]]:
        """Every live job from one listing of active/; more than one marker means a repair is due."""
        out: dict[str, list[ActiveMarker]] = {}
        for key, modified, _ in self.listing(keys.ACTIVE):
            parsed = parse_marker(key)
            if parsed:
                job_id, state, attempt = parsed
                out.setdefault(job_id, []).append(ActiveMarker(job_id, state, attempt, modified))
        return out

    # ---- preempted markers -------------------------------------------------------------------------
    def mark_preempted(self, job_id: str, body: dict[str, Any]) -> None:
        self.put_json(keys.preempted_marker(job_id), body)

    def clear_preempted(self, job_id: str) -> None:
        self.delete(keys.preempted_marker(job_id))

    def preempted(self) -> dict[str, datetime]:
        return {k.removeprefix(keys.PREEMPTED): m for k, m, _ in self.listing(keys.PREEMPTED)}

    # ---- heartbeats --------------------------------------------------------------------------------
    def heartbeats(self) -> list[Beat]:
        """Every job's heartbeats and output marks from one listing of heartbeats/."""
        return self.heartbeat_listing()[0]

    def heartbeat_listing(self) -> tuple[list[Beat], list[IdleMark]]:
        """Heartbeats, output marks and idle marks of every job, from one listing of heartbeats/."""
        beats: list[Beat] = []
        idle: list[IdleMark] = []
        for key, modified, _ in self.listing(keys.HEARTBEATS):
            parts = key.removeprefix(keys.HEARTBEATS).split("/")
            if len(parts) != 3 or not parts[1].isdigit():
                continue
            rank, _, suffix = parts[2].partition(".")
            if rank.isdigit() and suffix in ("", "output"):
                beats.append(Beat(parts[0], int(parts[1]), int(rank), suffix == "output", modified))
            elif rank.isdigit() and suffix == "idle":
                idle.append(IdleMark(parts[0], int(parts[1]), int(rank), modified))
        return beats, idle


def parse_marker(key: str) -> tuple[str, State, int] | None:
    parts = key.removeprefix(keys.ACTIVE).split("/")
    if len(parts) != 2:
        return None
    state, _, attempt = parts[1].rpartition(".")
    if state not in State.__members__ or not attempt.isdigit():
        return None
    return parts[0], State(state), int(attempt)
