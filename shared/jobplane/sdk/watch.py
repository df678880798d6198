"""A registry looked at again and again (a dashboard, a monitoring loop): `Client.watch()`.

Each look lists jobs/, active/, queue/ (and rejected/) and reads a job's record only when its listing entry
(modified time, size) changed since the previous look, a drop or a rejection only when it is new or changed: a
registry of thousands of jobs costs a few listings per look while nothing changes (bench/ui.py counts them).
Output is read by chunk from a cursor, each chunk once (chunks never change once written).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from jobplane.clouds.base import NotFound
from jobplane.model import keys
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import LIVE, State
from jobplane.ops import jobs
from jobplane.sdk.connection import Connection
from jobplane.sdk.errors import translated
from jobplane.sdk.job import Job
from jobplane.store.registry import JobNotFound, UnreadableRecord
from jobplane.views.jobview import JobView, rejected_reason

TAIL_BYTES = 256 * 1024  # a first look at output: at most this much of its end
CHUNK_CACHE = 2048  # output chunks kept in memory, the least recently read dropped first
COUNTED = (State.QUEUED, State.LAUNCHING, State.RUNNING, State.WAITING_CAPACITY, State.PREEMPTED)

Entry = tuple[datetime, int]  # a listing entry: modified time and size


@dataclass(frozen=True)
class Output:
    """A piece of one attempt and rank's output: `text`; `cursor`, the number of chunks uploaded so far (pass it
    as `after` for what comes next); `skipped`, the chunks a first look left out before `text`."""

    text: str
    cursor: int
    skipped: int


class Watch:
    """The jobs of a registry and their output, for looking again and again: what a look has read is kept and
    read again only when the registry's listings say it changed. `client.watch()`; one watch may be shared by
    threads (a web server's)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._records: dict[str, tuple[Entry, JobRecord]] = {}
        self._drops: dict[str, tuple[datetime, JobView]] = {}
        self._rejected: dict[str, tuple[datetime, str]] = {}
        self._chunks: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def jobs(self, include_finished: bool = False) -> list[Job]:
        """What `Client.list(include_finished=...)` returns (recorded jobs by id, then drops still in queue/, then
        with include_finished rejected ones), from listings and the records, drops and rejections that changed."""
        reg = self._connection.registry
        with translated():
            records = self._read_records()
            live = {job_id for job_id, markers in reg.active().items() if markers}
            views = [JobView.of(r) for job_id, r in sorted(records.items())
                     if include_finished or job_id in live or r.state in LIVE]
            seen = set(records)
            views += self._read_drops(seen)
            seen |= {v.id for v in views}
            if include_finished:
                views += self._read_rejected(seen)
        return [Job(self._connection, v) for v in views]

    def counts(self) -> dict[State, int]:
        """Live jobs by state (QUEUED, LAUNCHING, RUNNING, WAITING_CAPACITY, PREEMPTED), from one listing of active/
        and one of queue/ (a drop not recorded yet is QUEUED)."""
        reg = self._connection.registry
        out = dict.fromkeys(COUNTED, 0)
        recorded = set()
        with translated():
            for job_id, markers in reg.active().items():
                if markers:
                    recorded.add(job_id)
                    state = max(markers, key=lambda m: m.since).state
                    out[state] = out.get(state, 0) + 1
            for key, _, _ in reg.listing(keys.QUEUE):
                drop = keys.parse_drop(key)
                if drop is not None and drop.job_id not in recorded:
                    out[State.QUEUED] += 1
        return out

    def output(self, job_id: str, attempt: int, rank: int, after: int | None = None,
               tail_bytes: int = TAIL_BYTES) -> Output:
        """One attempt and rank's output after its first `after` chunks; with after None (a first look) only its
        end: at most tail_bytes (the last chunk whole even if longer), and how many chunks were left out."""
        with translated():
            found = [key for _, _, key in jobs.node_chunks(self._connection.registry, "logs", job_id, attempt, rank)]
            skipped = 0
            if after is None:
                start, size = len(found), 0
                while start > 0:
                    text = self._chunk(found[start - 1])
                    if size + len(text) > tail_bytes and start < len(found):
                        break
                    size += len(text)
                    start -= 1
                skipped = start
            else:
                start = max(0, min(after, len(found)))
            return Output("".join(self._chunk(k) for k in found[start:]), len(found), skipped)

    # ---- what a look reads, cached by listing entry ----------------------------------------------------------
    def _read_records(self) -> dict[str, JobRecord]:
        reg = self._connection.registry
        listed: dict[str, Entry] = {}
        for key, modified, size in reg.listing(keys.JOBS):
            if job_id := keys.parse_job_record(key):
                listed[job_id] = (modified, size)
        out: dict[str, JobRecord] = {}
        for job_id, entry in listed.items():
            with self._lock:
                cached = self._records.get(job_id)
            if cached is not None and cached[0] == entry:
                out[job_id] = cached[1]
                continue
            try:
                record = reg.job(job_id)
            except (JobNotFound, UnreadableRecord):  # gone since the listing, or not readable: not shown
                continue
            with self._lock:
                self._records[job_id] = (entry, record)
            out[job_id] = record
        with self._lock:
            for gone in set(self._records) - set(listed):
                del self._records[gone]
        return out

    def _read_drops(self, recorded: set[str]) -> list[JobView]:
        reg = self._connection.registry
        views, listed, seen = [], set(), set(recorded)
        for key, modified, _ in reg.listing(keys.QUEUE):
            drop = keys.parse_drop(key)
            if drop is None or drop.job_id in seen:
                continue
            listed.add(key)
            with self._lock:
                cached = self._drops.get(key)
            if cached is None or cached[0] != modified:
                try:
                    cached = (modified, jobs.queued_view(drop.job_id, key, reg.get_bytes(key), modified))
                except NotFound:  # the launcher took it since the listing
                    continue
                with self._lock:
                    self._drops[key] = cached
            seen.add(drop.job_id)
            views.append(cached[1])
        with self._lock:
            for gone in set(self._drops) - listed:
                del self._drops[gone]
        return views

    def _read_rejected(self, seen: set[str]) -> list[JobView]:
        reg = self._connection.registry
        views = []
        for key, modified, _ in reg.listing(keys.REJECTED):
            job_id = keys.parse_rejected_error(key)
            if not job_id or job_id in seen:
                continue
            with self._lock:
                known = self._rejected.get(key)
            if known is None or known[0] != modified:
                try:
                    known = (modified, rejected_reason(reg.get_json(key)))
                except (NotFound, ValueError):
                    continue
                with self._lock:
                    self._rejected[key] = known
            views.append(JobView(job_id, State.INVALID, modified, reason=known[1]))
        return views

    def _chunk(self, key: str) -> str:
        with self._lock:
            if key in self._chunks:
                self._chunks.move_to_end(key)
                return self._chunks[key]
        text = self._connection.registry.get_bytes(key).decode(errors="replace")
        with self._lock:
            self._chunks[key] = text
            while len(self._chunks) > CHUNK_CACHE:
                self._chunks.popitem(last=False)
        return text
