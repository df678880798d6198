"""Sweep records in the registry: sweeps/<id>/sweep.json, created create-only and changed only by compare-and-swap
on its version (S3 ETag, GCS generation), as job.json is; and the active-sweeps/<id> marker, which exists while
the sweep may still have work (RUNNING, or cancelled with trials not yet stopped), so the reconcile run finds its
work by one listing.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from jobplane.clouds.base import NotFound, PreconditionFailed
from jobplane.model import keys
from jobplane.store.rooted import CAS_RETRIES, RegistryError, RootedStore, backoff

if TYPE_CHECKING:  # the record's models load when one is read: the scheduled pass lists the markers on every run
    from jobplane.sweeps.record import SweepRecord

log = logging.getLogger("jobplane.sweeps")


class SweepExists(RegistryError):
    def __init__(self, sweep_id: str) -> None:
        super().__init__(f"sweep {sweep_id!r} already exists: sweep ids are never reused")
        self.sweep_id = sweep_id


class SweepNotFound(RegistryError):
    """why: what the id is instead, when it is something (ops.find says); queued: its spec is still in queue/;
    kind: what was looked for, a sweep or an array."""

    def __init__(self, sweep_id: str, why: str = "", queued: bool = False, kind: str = "sweep") -> None:
        super().__init__(f"no {kind} {sweep_id!r}" + (f" {why}" if why else ""))
        self.sweep_id, self.why, self.queued, self.kind = sweep_id, why, queued, kind


class UnreadableSweep(RegistryError):
    def __init__(self, sweep_id: str, problem: str) -> None:
        super().__init__(f"sweep {sweep_id}: sweep.json does not parse: {problem}")
        self.sweep_id = sweep_id


def _dump(record: SweepRecord) -> bytes:
    return record.model_dump_json(exclude_none=True, indent=1).encode()


def create(reg: RootedStore, record: SweepRecord) -> SweepRecord:
    """Create-only, then the marker. The same spec again (a redelivered drop) returns the record there;
    another spec under the id raises SweepExists."""
    try:
        reg.put_if_absent(keys.sweep_record(record.id), _dump(record))
    except PreconditionFailed:
        current = get(reg, record.id)[0]
        if current.spec != record.spec:
            raise SweepExists(record.id) from None
        record = current
    if record.live:
        reg.put(keys.active_sweep(record.id), b"", "text/plain")
    return record


def get(reg: RootedStore, sweep_id: str) -> tuple[SweepRecord, str]:
    """The record and its version (to compare-and-swap against)."""
    from jobplane.model.bounds import STORED
    from jobplane.model.spec import known_fields
    from jobplane.sweeps.record import SweepRecord

    try:
        blob = reg.get_object(keys.sweep_record(sweep_id))
    except NotFound:
        raise SweepNotFound(sweep_id) from None
    try:
        data = json.loads(blob.data)
        if isinstance(data, dict) and isinstance(data.get("spec"), dict):
            data["spec"] = known_fields(data["spec"])  # a newer version's spec fields: ignored
        return SweepRecord.model_validate(data, context=STORED), blob.version
    except ValueError as exc:
        raise UnreadableSweep(sweep_id, str(exc).replace("\n", " ")[:500]) from None


def exists(reg: RootedStore, sweep_id: str) -> bool:
    return reg.has(keys.sweep_record(sweep_id))


def update(reg: RootedStore, sweep_id: str, change: Callable[[SweepRecord], SweepRecord]) -> tuple[SweepRecord, bool]:
    """Compare-and-swap the record to change(current), re-reading and calling change again after a conflict: a
    change is decided on the record it replaces. Returns (the record, whether this call wrote it)."""
    for tries in range(CAS_RETRIES):
        current, version = get(reg, sweep_id)
        new = change(current)
        if new == current:
            return current, False
        new = new.model_copy(update={"write": secrets.token_hex(8)})
        try:
            reg.put_if_match(keys.sweep_record(sweep_id), _dump(new), version)
            return new, True
        except PreconditionFailed:
            if get(reg, sweep_id)[0] == new:  # our own write, resent after its response was lost
                return new, True
            backoff(tries + 1)
    raise RegistryError(f"sweep {sweep_id}: gave up after {CAS_RETRIES} conflicting writes")


def retire(reg: RootedStore, sweep_id: str) -> None:
    """Drop the marker of a sweep with nothing left to do."""
    reg.delete(keys.active_sweep(sweep_id))


def live(reg: RootedStore) -> list[str]:
    """The sweeps with a marker, from one listing of active-sweeps/."""
    return sorted(s for k, _, _ in reg.listing(keys.ACTIVE_SWEEPS) if (s := keys.parse_active_sweep(k)))


def all_ids(reg: RootedStore) -> list[str]:
    """Every recorded sweep, from one listing of sweeps/."""
    return sorted(s for k, _, _ in reg.listing(keys.SWEEPS) if (s := keys.parse_sweep_record(k)))
