"""The job registry over a registry's objects: records, CAS transitions, events and markers (docs/architecture.md).

Only control functions write job.json, always by compare-and-swap; a lost race re-reads and re-checks
the transition, so two overlapping functions can never both act on one state.

No event is lost to a crash: the record carries the event of the write that made it (`last_event`, with the
stamp of its key chosen before the CAS), so a function that dies between the CAS and the event object leaves
the event in job.json. The next transition, a marker repair and a reconciler that reads the record anyway
write it (create-only, to the same key): the history ends up complete, each event once.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from jobplane.clouds.base import NotFound, ObjectStore, PreconditionFailed
from jobplane.model import keys
from jobplane.model.bounds import STORED
from jobplane.model.clock import utcnow
from jobplane.model.listings import ActiveMarker, Beat, IdleMark
from jobplane.model.states import LIVE, TERMINAL, State, allowed
from jobplane.store.rooted import CAS_RETRIES, RegistryError, RootedStore, backoff

if TYPE_CHECKING:
    from pydantic import BaseModel

    from jobplane.model import (
        history,
        records,  # its models are built at import; the registry only names one in a signature
    )
    from jobplane.model.history import LastEvent
    from jobplane.model.jobfacts import JobFacts
    from jobplane.model.jobrecord import JobRecord, Updates
    from jobplane.model.policy import Policy
    from jobplane.model.spec import JobSpec

log = logging.getLogger("jobplane.registry")
P = TypeVar("P")  # what a reader makes of job.json


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


class UnreadableRecord(RegistryError):
    """job.json does not parse (written by hand, by a version too far apart, or torn): the job is left alone,
    and the others go on."""

    def __init__(self, job_id: str, version: str, problem: str) -> None:
        super().__init__(f"job {job_id}: job.json (version {version}) does not parse: {problem}")
        self.job_id, self.version, self.problem = job_id, version, problem


def _record_model() -> type[JobRecord]:
    """JobRecord, imported on first use: its models (the spec's, a sweep's) are built then, so a run that reads the
    policy and lists (a scheduled check of healthy jobs, an idle backstop) never builds them."""
    from jobplane.model.jobrecord import JobRecord

    return JobRecord


class UnknownField(RegistryError):
    """An update names no JobRecord field (a misspelling would otherwise be dropped silently)."""

    def __init__(self, job_id: str, names: Collection[str]) -> None:
        import difflib  # the hint is for a caller's bug: no run that goes right pays for the import

        hints = []
        for name in sorted(names):
            close_to = difflib.get_close_matches(name, _record_model().model_fields, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close_to[0]!r}?)" if close_to else ""))
        super().__init__(f"job {job_id}: no such job record field: {', '.join(hints)}")
        self.job_id, self.names = job_id, sorted(names)



def _dump(model: BaseModel) -> bytes:
    return model.model_dump_json(exclude_none=True, indent=1).encode()


def _check_fields(job_id: str, updates: Collection[str]) -> None:
    unknown = set(updates) - set(_record_model().model_fields)
    if unknown:
        raise UnknownField(job_id, unknown)


def read_job(objects: RootedStore, job_id: str) -> tuple[JobRecord, str]:
    """job.json and its version (to compare-and-swap against): JobNotFound, or UnreadableRecord saying why it does not
    parse. Reading needs no registry: an agent, a sweep's curves and the vending functions read records this way."""
    return _read_record(objects, job_id, _job_record)


def read_job_facts(objects: RootedStore, job_id: str) -> JobFacts:
    """What a credential is decided on from job.json (jobplane.model.jobfacts): JobNotFound, or UnreadableRecord
    saying why those fields do not parse. The vend functions read records this way, without the record's models."""
    from jobplane.model.jobfacts import parse_facts

    return _read_record(objects, job_id, lambda data: parse_facts(data, job_id))[0]


def _read_record(objects: RootedStore, job_id: str, parse: Callable[[bytes], P]) -> tuple[P, str]:
    """job.json through `parse`, and its version: JobNotFound, or UnreadableRecord saying why it does not parse."""
    try:
        blob = objects.get_object(keys.job_record(job_id))
    except NotFound:
        raise JobNotFound(job_id) from None
    try:
        return parse(blob.data), blob.version
    except ValueError as exc:  # JSON or validation (pydantic's ValidationError and SpecError are ValueErrors)
        raise UnreadableRecord(job_id, blob.version, str(exc).replace("\n", " ")[:500]) from None


def _job_record(raw: bytes) -> JobRecord:
    data = json.loads(raw)
    if isinstance(data, dict) and isinstance(data.get("spec"), dict):
        from jobplane.model.spec import known_fields

        data["spec"] = known_fields(data["spec"])  # a newer version's fields: ignored, as JobRecord's are
    return _record_model().model_validate(data, context=STORED)


# Told of every transition this process made (old record, new record), after its CAS won: exactly one
# caller hears of each transition, however many reconcilers raced for it (jobplane.deployment.notify listens).
TransitionListener = Callable[["JobRecord", "JobRecord"], None]


class Registry(RootedStore):
    """The job registry: one registry's objects (a RootedStore: raw keys, listings, presigned URLs) and the job
    records kept on them. The control functions (and a cancel) hold one; an agent holds only a RootedStore."""

    def __init__(self, store: ObjectStore, root: str = "", listeners: Sequence[TransitionListener] = (), *,
                 vend_url: str | None = None) -> None:
        super().__init__(store, root)
        self.listeners = list(listeners)
        self.vend_url = vend_url  # where a job's agent asks for its job's credentials (jobplane.decide.vend)

    def policy(self) -> Policy:
        """config/policy.yaml, or the defaults when it is absent."""
        # imported here: a control function's deployment has it at import (every run reads it), the vend function never
        from jobplane.model.policy import DEFAULT_POLICY, parse_policy

        try:
            return parse_policy(self.get_bytes(keys.POLICY))
        except NotFound:
            return DEFAULT_POLICY

    # ---- records -----------------------------------------------------------------------------------
    def create_job(self, job_id: str, spec: JobSpec, now: datetime | None = None) -> JobRecord:
        """Create-only: a second create of the same id raises JobExists and changes nothing."""
        from jobplane.model import history  # with the record's models (_record_model), which import it anyway

        now = now or utcnow()
        spec = spec if spec.id == job_id else spec.model_copy(update={"id": job_id})
        event = history.Created(state=State.QUEUED, spec=spec.model_dump(mode="json"))
        created = history.LastEvent(stamp=keys.stamp(now), kind=event.kind,
                            body={"time": now.isoformat(), "kind": event.kind, **event.body()})
        record = _record_model()(id=job_id, spec=spec, state=State.QUEUED, owner=spec.owner,
                           created_at=now, updated_at=now, state_since=now, last_event=created,
                           layout=keys.DATA_LAYOUT)
        try:
            self.put_if_absent(keys.job_record(job_id), _dump(record))
        except PreconditionFailed:
            if not self._landed(job_id, record):
                raise JobExists(job_id) from None
        self.complete_history(record)
        self._move_marker(job_id, None, record)
        return record

    def get(self, job_id: str) -> tuple[JobRecord, str]:
        return read_job(self, job_id)

    def job(self, job_id: str) -> JobRecord:
        return self.get(job_id)[0]

    def exists(self, job_id: str) -> bool:
        return self.has(keys.job_record(job_id))

    def transition(
        self,
        job_id: str,
        to: State,
        *,
        now: datetime | None = None,
        reason: str | None = None,
        expect: Collection[State] | None = None,
        expect_attempt: int | None = None,
        expect_event: str | None = None,
        event: history.Detail | None = None,
        cause: StrEnum | None = None,  # a decide.rules Rule or LaunchCause (the store sits below the decisions)
        **updates: Unpack[Updates],
    ) -> JobRecord:
        """Move a job to `to` by compare-and-swap, retrying on conflict.

        expect / expect_attempt say what the caller saw; if the job has moved on (another function won
        the race), the transition is refused instead of being applied twice. `reason` (prose) and `cause` (the
        rule or launcher decision that made it) go on the record and its event; `event` adds to the event.
        """
        from jobplane.model import history  # with the record's models (_record_model), which import it anyway
        from jobplane.model.usage import close

        _check_fields(job_id, updates)  # mypy checks the names a caller writes; this, the ones it builds
        now = now or utcnow()
        completed: LastEvent | None = None
        for tries in range(CAS_RETRIES):
            current, version = self.get(job_id)
            if expect is not None and current.state not in expect:
                raise TransitionRefused(job_id, current.state, to, f"state is {current.state}, expected "
                                        + "/".join(sorted(expect)))
            if expect_attempt is not None and current.attempt != expect_attempt:
                raise TransitionRefused(job_id, current.state, to,
                                        f"attempt is {current.attempt}, expected {expect_attempt}")
            if expect_event is not None and (current.last_event is None or current.last_event.stamp != expect_event):
                raise TransitionRefused(job_id, current.state, to, "the record changed since it was read")
            if not allowed(current.state, to):
                raise TransitionRefused(job_id, current.state, to)
            said = history.Transitioned(source=current.state, to=to, attempt=updates.get("attempt", current.attempt),
                                        reason=reason, cause=str(cause) if cause else None)
            body = {"time": now.isoformat(), "kind": said.kind, **said.body(), **(event.body() if event else {})}
            last = history.LastEvent(stamp=history.stamp_after(current.last_event, now), kind=said.kind, body=body)
            fields: dict[str, Any] = {"state": to, "updated_at": now, "reason": reason, "cause": said.cause,
                                      **updates, "last_event": last}
            if to != current.state or fields.get("attempt", current.attempt) != current.attempt:
                fields["state_since"] = now
            new = _record_model().model_validate({**current.model_dump(), **fields}, context=STORED)
            if any(u.open for u in new.usage):  # leaving an attempt ends its instances' billed time, unless a
                keep = new.attempt if new.state in (State.LAUNCHING, State.RUNNING) or new.held(now) else None  # hold
                new = new.model_copy(update={"usage": close(new.usage, keep, now)})
            if current.last_event != completed:  # the event of the write before ours: it may have died after its CAS
                self.complete_history(current)
                completed = current.last_event
            try:
                self.put_if_match(keys.job_record(job_id), _dump(new), version)
            except PreconditionFailed:
                if not self._landed(job_id, new):
                    backoff(tries + 1)
                    continue
                if self.job(job_id).last_event != new.last_event:  # a later writer moved on: its markers stand
                    self._tell(current, new)
                    return new
            self.complete_history(new)
            self._move_marker(job_id, current, new)
            if current.holds_nodes(now) or new.state in TERMINAL:
                self._release(new, now)
            self._tell(current, new)
            return new
        raise RegistryError(f"job {job_id}: gave up after {CAS_RETRIES} conflicting writes")

    def _release(self, new: JobRecord, now: datetime) -> None:
        """An attempt that stops holding its nodes (it ended, waits, or its hold is over) gives its admission back,
        so the quota is free the moment the write that ended it lands. A failure here leaves the reservation to the
        scheduled pass (jobplane.control.admission.reclaim), never undoes the write."""
        if new.holds_nodes(now):
            return
        from jobplane.store import admission  # only an attempt's end releases one (and a cold start loads none)

        try:
            admission.release(self, new.owner, new.id, ended=new.state in TERMINAL, usage=new.usage, now=now)
        except Exception:
            log.exception("could not release %s's admission", new.id, extra={"job_id": new.id})

    def _tell(self, old: JobRecord, new: JobRecord) -> None:
        for listener in self.listeners:
            try:
                listener(old, new)
            except Exception:  # a listener (a notification) must never undo or repeat a transition
                log.exception("transition listener failed for %s", new.id, extra={"job_id": new.id})

    def update(self, job_id: str, *, now: datetime | None = None, **updates: Unpack[Updates]) -> JobRecord:
        """CAS-update fields without a state change (e.g. recording a Spot warning)."""
        _check_fields(job_id, updates)
        now = now or utcnow()
        for tries in range(CAS_RETRIES):
            current, version = self.get(job_id)
            new = _record_model().model_validate({**current.model_dump(), "updated_at": now, **updates},
                                                 context=STORED)
            try:
                self.put_if_match(keys.job_record(job_id), _dump(new), version)
            except PreconditionFailed:
                if self._landed(job_id, new):
                    return new
                backoff(tries + 1)
                continue
            if new.state in LIVE:
                self._touch_marker(current, new)
            return new
        raise RegistryError(f"job {job_id}: gave up after {CAS_RETRIES} conflicting writes")

    def _touch_marker(self, before: JobRecord, ours: JobRecord) -> None:
        """Rewrite a live record's marker after a write that moved no state (the watch reads the record again), and
        rename it when the write recorded the attempt's limits. A transition that landed between our write and this
        one may have just moved the marker away: then the job has a marker it should not, and a repair removes it."""
        self._move_marker(ours.id, before, ours)
        now = self.job(ours.id)
        if (now.state, now.attempt) != (ours.state, ours.attempt):
            self.repair_markers(ours.id)

    def close_usage(self, job_id: str, *, now: datetime) -> JobRecord:
        """End, at `now`, the billed time of the instances the record still counts: a debug hold's end."""
        from jobplane.model.usage import close  # with the record's models (_record_model), which import it anyway

        for tries in range(CAS_RETRIES):
            current, version = self.get(job_id)
            if not any(u.open for u in current.usage):
                return current
            new = current.model_copy(update={"usage": close(current.usage, None, now), "updated_at": now})
            try:
                self.put_if_match(keys.job_record(job_id), _dump(new), version)
            except PreconditionFailed:
                if not self._landed(job_id, new):
                    backoff(tries + 1)
                    continue
            self._release(new, now)  # the hold's end
            return new
        raise RegistryError(f"job {job_id}: gave up after {CAS_RETRIES} conflicting writes")

    def _landed(self, job_id: str, ours: JobRecord) -> bool:
        """After a 412: was it our own write, resent by the SDK after its response was lost (botocore retries a
        PUT up to 8 times)? Then job.json is the record we wrote (its event stamp makes it unique), or a later
        writer moved on from it and wrote its event to the history on the way."""
        try:
            current = self.job(job_id)
        except JobNotFound:
            return False
        if current == ours or (ours.last_event is not None and current.last_event == ours.last_event):
            return True
        if ours.last_event is None:
            return False
        try:
            written = self.get_bytes(ours.last_event.key(job_id))
        except NotFound:
            return False
        body = ours.last_event.model_dump(mode="json")["body"]
        return bool(written == json.dumps(body, indent=1).encode())

    def note_unreadable(self, error: UnreadableRecord, now: datetime | None = None) -> None:
        """An `unreadable-record` event naming the problem, once per version of the bad job.json."""
        from jobplane.model import history  # with the record's models (_record_model), which import it anyway

        now = now or utcnow()
        key = keys.event(error.job_id, keys.stamp(now), "unreadable-record")
        flag = keys.ignored_flag(error.job_id, 0, f"job.json.{error.version}")
        try:
            self.put_if_absent(flag, b"{}")
        except PreconditionFailed:
            return  # noted already
        self.put_json(key, {"time": now.isoformat(), "kind": "unreadable-record",
                            **history.UnreadableRecord(version=error.version, problem=error.problem).body()})

    # ---- events ------------------------------------------------------------------------------------
    def complete_history(self, record: JobRecord) -> None:
        """Write the event the record carries, unless it is in the history already (create-only, same key)."""
        if record.last_event is None:
            return
        with contextlib.suppress(PreconditionFailed):
            body = record.last_event.model_dump(mode="json")["body"]  # as job.json has it: the same bytes each time
            self.put_if_absent(record.last_event.key(record.id), json.dumps(body, indent=1).encode())

    def record_event(self, job_id: str, event: history.Event, now: datetime | None = None) -> None:
        """An event that goes with no write of job.json (a flag, a refusal): written at once, nothing to lose."""
        now = now or utcnow()
        self.put_json(keys.event(job_id, keys.stamp(now), event.kind),
                      {"time": now.isoformat(), "kind": event.kind, **event.body()})

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return [json.loads(self.get_created(k)) for k, _, _ in self.listing(keys.events_prefix(job_id))]

    # ---- active markers ----------------------------------------------------------------------------
    def _move_marker(self, job_id: str, old: JobRecord | None, new: JobRecord) -> None:
        """The marker follows the record: each names its own (JobRecord.marker, a RUNNING one with its limits)."""
        new_key = new.marker
        if new.state in LIVE:
            self._put_marker(new_key, new)
        if old is not None:
            old_key = old.marker
            if old_key != new_key or new.state not in LIVE:
                self.delete(old_key)

    def repair_markers(self, job_id: str) -> None:
        """Make active/<id>/ match job.json again (after a function died between the two writes)."""
        record = self.job(job_id)
        self.complete_history(record)  # markers disagree when a function died after its CAS: so may the history
        want = record.marker if record.state in LIVE else None
        have = [k for k, _, _ in self.listing(keys.active_prefix(job_id))]
        if want and want not in have:  # first: a repair cut short never leaves a live job without a marker
            self._put_marker(want, record)
        for k in have:
            if k != want:
                self.delete(k)

    def _put_marker(self, key: str, record: JobRecord) -> None:
        """The marker's body is the record's write time, so that each write of a live record gives its marker a new
        version (an ETag too, where an empty body's never changes): Watch reads a live record again only then.
        Only the key is the marker's meaning: a marker with an empty body (written before) is just as live."""
        self.put(key, record.updated_at.isoformat().encode(), "text/plain")

    def active(self) -> dict[str, list[ActiveMarker]]:
        """Every live job from one listing of active/; more than one marker means a repair is due."""
        return self.active_listing()[0]

    def active_listing(self) -> tuple[dict[str, list[ActiveMarker]], set[keys.AttemptKey], list[keys.Held]]:
        """From one listing of active/: every live job's markers, the attempts flagged idle, and the held attempts."""
        out: dict[str, list[ActiveMarker]] = {}
        idle: set[keys.AttemptKey] = set()
        held: list[keys.Held] = []
        for key, modified, _ in self.listing(keys.ACTIVE):
            if marker := keys.parse_active_marker(key):
                out.setdefault(marker.job_id, []).append(ActiveMarker(marker.job_id, marker.state, marker.attempt,
                                                                      modified, marker.limits))
            elif flag := keys.parse_idle_flag(key):
                idle.add(flag)
            elif hold := keys.parse_held(key):
                held.append(hold)
        return out, idle, held

    # ---- stopping ----------------------------------------------------------------------------------
    def request_stop(self, job_id: str, *, by: records.StopBy, reason: str | None, now: datetime) -> None:
        """Ask every agent of the job to checkpoint, sync and stop (jobs/<id>/control/stop): the one writer of a
        stop request, for a cancel and for every reconciler's stop (a sweep's early stops included)."""
        from jobplane.model import records  # built on first use, as everywhere in the registry

        self.put_json(keys.stop_request(job_id), records.StopRequest(time=now, by=by, reason=reason).body())

    # ---- preempted markers -------------------------------------------------------------------------
    def mark_preempted(self, job_id: str, marker: records.PreemptedMarker) -> None:
        self.put_json(keys.preempted_marker(job_id), marker.body())

    def clear_preempted(self, job_id: str) -> None:
        self.delete(keys.preempted_marker(job_id))

    def preempted(self) -> dict[str, datetime]:
        return {job_id: m for k, m, _ in self.listing(keys.PREEMPTED) if (job_id := keys.parse_preempted_marker(k))}

    # ---- heartbeats --------------------------------------------------------------------------------
    def heartbeats(self) -> list[Beat]:
        """Every job's heartbeats and output marks from one listing of heartbeats/."""
        return self.heartbeat_listing()[0]

    def heartbeat_listing(self) -> tuple[list[Beat], list[IdleMark]]:
        """Heartbeats, output marks and idle marks of every job, from one listing of heartbeats/."""
        beats: list[Beat] = []
        idle: list[IdleMark] = []
        for key, modified, _ in self.listing(keys.HEARTBEATS):
            if (beat := keys.parse_heartbeat(key)) is None:
                continue
            if beat.mark == "idle":
                idle.append(IdleMark(beat.job_id, beat.attempt, beat.rank, modified))
            else:
                beats.append(Beat(beat.job_id, beat.attempt, beat.rank, beat.mark == "output", modified))
        return beats, idle

