"""Admission records in the registry (jobplane.model.admission): read, changed by compare-and-swap, released.

`change` is the one writer: it reads the record, asks `decide` for the new one and writes it create-only (no
record yet) or against the version it read, retrying a lost race with backoff. `decide` must be idempotent
(None: nothing to write), so a write whose response was lost and that fails on its own first try reads the
record back, finds its change there and stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from jobplane.clouds.base import NotFound, PreconditionFailed
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.store.rooted import CAS_RETRIES, RegistryError, RootedStore, backoff

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.admission import AdmissionRecord
    from jobplane.model.usage import AttemptUsage

log = logging.getLogger("jobplane.admission")

T = TypeVar("T")


def read(objects: RootedStore, key: str) -> tuple[AdmissionRecord, str | None]:
    """The record and its version (None: there is none yet, an empty record)."""
    from jobplane.model.admission import AdmissionRecord  # an owner's line: a run with none never builds its model
    from jobplane.model.records import RecordError

    try:
        blob = objects.get_object(key)
    except NotFound:
        return AdmissionRecord(), None
    try:
        return AdmissionRecord.parse(blob.data), blob.version
    except RecordError as exc:  # a quota nobody can count is not guessed at: the admission waits for a fix
        raise RegistryError(f"{key}: {exc}") from None


def change(objects: RootedStore, key: str,
           decide: Callable[[AdmissionRecord], tuple[AdmissionRecord | None, T]]) -> T:
    """Apply decide(record) -> (the record to write or None, the answer) by compare-and-swap; the answer of the
    try that wrote (or found nothing to write)."""
    for tries in range(CAS_RETRIES):
        record, version = read(objects, key)
        new, answer = decide(record)
        if new is None:
            return answer
        data = new.model_dump_json(exclude_defaults=True).encode()
        try:
            if version is None:
                objects.put_if_absent(key, data)
            else:
                objects.put_if_match(key, data, version)
            return answer
        except PreconditionFailed:
            backoff(tries + 1)
    raise RegistryError(f"{key}: gave up after {CAS_RETRIES} conflicting writes")


def _dropping(job_ids: set[str], *, waiting: bool = True,
              ) -> Callable[[AdmissionRecord], tuple[AdmissionRecord | None, bool]]:
    def drop(record: AdmissionRecord) -> tuple[AdmissionRecord | None, bool]:
        new = record.without(job_ids, waiting=waiting)
        return (new, True) if new != record else (None, False)
    return drop


def _charging(job_id: str, usage: Sequence[AttemptUsage], now: datetime, *, waiting: bool,
              ) -> Callable[[AdmissionRecord], tuple[AdmissionRecord | None, bool]]:
    """Drop the job's reservation, charging the owner's month with what its attempts since the reserved one cost
    in it, in the same write: a resent write finds the reservation gone and charges nothing twice."""
    from jobplane.model.admission import month_start
    from jobplane.model.usage import spent

    def drop(record: AdmissionRecord) -> tuple[AdmissionRecord | None, bool]:
        new = record.without({job_id}, waiting=waiting)
        held = record.of(job_id)
        if held is not None:
            new = new.charged(held.owner, spent(usage, range(held.attempt, 1 << 30), now, month_start(now)), now)
        return (new, True) if new != record else (None, False)
    return drop


def release(objects: RootedStore, owner: str, job_id: str, *, ended: bool = False,
            usage: Sequence[AttemptUsage] = (), now: datetime | None = None) -> bool:
    """The job's attempt no longer holds nodes: its reservation leaves the owner's record (one GET, and a write
    when it was there), its `usage` charged to the owner's month as of `now`, and the deployment's and its instance
    families' when it held one there; a job that `ended` leaves the owner's line too, and the deployment's order
    when it waited there. Whether the owner's record changed."""
    record = read(objects, keys.admission_owner(owner))[0]
    found, waiter = record.of(job_id), record.waiter(job_id) if ended else None
    if found is None and waiter is None:
        return False
    if (found is not None and found.capped) or (waiter is not None and waiter.capped):
        # the deployment's first: a crash in between leaves only an owner's reservation, which the pass reclaims
        change(objects, keys.ADMISSION_DEPLOYMENT, _dropping({job_id}))
    for family in found.families if found is not None else ():  # the same for the instance families' caps
        change(objects, keys.admission_family(family), _dropping({job_id}))
    dropped = change(objects, keys.admission_owner(owner),
                     _charging(job_id, usage, now or utcnow(), waiting=ended))
    log.info("released %s's nodes (%s)", job_id, owner, extra={"job_id": job_id})
    return dropped


def drop(objects: RootedStore, key: str, job_ids: set[str]) -> bool:
    """Remove these jobs' reservations and waits from one record; whether any was there."""
    return change(objects, key, _dropping(job_ids))
