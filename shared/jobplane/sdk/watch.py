"""A registry looked at again and again (a dashboard, a monitoring loop): `Client.watch()`.

Each look lists active/ and queue/ (and rejected/), and jobs/ with a delimiter (one entry per job, whatever the job
wrote: its logs, metrics, events and checkpoints cost no listing pages), and reads a job's record only when it may
have changed: a job new to the watch, a live job whose active/ marker was written or moved since (each write of a
live record rewrites its marker, the record's write time in its body: a transition moves it, an update touches it),
a job whose marker went (it ended). An ended record changes no more but for a debug hold's closing of its usage:
such a record, and a live record whose marker is missing (a writer died between the two writes), are read on every
look. A drop or a rejection is read only when it is new or changed. So a registry of thousands of jobs costs a few
listing pages per thousand jobs per look while nothing changes (bench/ui.py counts them).
Output is read by chunk from a cursor, each chunk once (chunks never change once written).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from jobplane.clouds.base import NotFound, ObjectInfo
from jobplane.model import keys
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

Token = tuple[tuple[str, str], ...]  # a job's active/ markers as listed: each one's key and version


def _settled(view: JobView | None, token: Token) -> bool:
    """Whether a record read under these markers stays true until they change: a live record's marker is
    rewritten with each write of it, and an ended record changes no more, but for a debug hold's usage."""
    if view is None or view.record is None or token:
        return True  # a record's creation writes its first marker; a marker's end is the job's end
    return view.state not in LIVE and not any(used.open for used in view.record.usage)


def _counts(markers: dict[str, list[ObjectInfo]], queued: list[tuple[str, datetime, int]]) -> dict[State, int]:
    """Live jobs by state from the active/ markers (the newest, where a repair is due) and the drops not recorded."""
    out = dict.fromkeys(COUNTED, 0)
    for infos in markers.values():
        newest = max(infos, key=lambda info: info.last_modified)
        marker = keys.parse_active_marker(newest.key)
        if marker is not None:
            out[marker.state] = out.get(marker.state, 0) + 1
    for key, _, _ in queued:
        drop = keys.parse_drop(key)
        if drop is not None and drop.job_id not in markers:
            out[State.QUEUED] += 1
    return out


@dataclass(frozen=True)
class Look:
    """One look at a registry: its jobs (Watch.jobs) and its live jobs counted by state (Watch.counts)."""

    jobs: list[Job]
    counts: dict[State, int]


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
        self._records: dict[str, tuple[Token, JobView | None]] = {}  # a view of each record as last read
        self._drops: dict[str, tuple[datetime, JobView]] = {}
        self._rejected: dict[str, tuple[datetime, str]] = {}
        self._chunks: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def jobs(self, include_finished: bool = False) -> list[Job]:
        """What `Client.list(include_finished=...)` returns (recorded jobs by id, then drops still in queue/, then
        with include_finished rejected ones), from listings and the records, drops and rejections that changed."""
        return self.look(include_finished).jobs

    def look(self, include_finished: bool = False) -> Look:
        """`jobs(include_finished)` and `counts()` from one set of listings (a page of the dashboard)."""
        reg = self._connection.registry
        with translated():
            markers = self._markers()
            queued = list(reg.listing(keys.QUEUE))
            records = self._read_records(markers)
            views = [view for job_id, view in sorted(records.items())
                     if include_finished or job_id in markers or view.state in LIVE]
            seen = set(records)
            views += self._read_drops(queued, seen)
            seen |= {v.id for v in views}
            if include_finished:
                views += self._read_rejected(seen)
        return Look([Job(self._connection, v) for v in views], _counts(markers, queued))

    def counts(self) -> dict[State, int]:
        """Live jobs by state (QUEUED, LAUNCHING, RUNNING, WAITING_CAPACITY, PREEMPTED), from one listing of active/
        and one of queue/ (a drop not recorded yet is QUEUED)."""
        reg = self._connection.registry
        with translated():
            return _counts(self._markers(), list(reg.listing(keys.QUEUE)))

    def output(self, job: Job, attempt: int, rank: int, after: int | None = None,
               tail_bytes: int = TAIL_BYTES) -> Output:
        """One attempt and rank's output after its first `after` chunks; with after None (a first look) only its
        end: at most tail_bytes (the last chunk whole even if longer), and how many chunks were left out. NotYours
        for a job of another team."""
        with translated(job.id, job.owner):
            found = [key for _, _, key in jobs.node_chunks(self._connection.registry, "logs", job.data, attempt, rank)]
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
    def _markers(self) -> dict[str, list[ObjectInfo]]:
        """Each live job's active/ markers as listed (more than one while a repair is due)."""
        markers: dict[str, list[ObjectInfo]] = {}
        for info in self._connection.registry.entries(keys.ACTIVE):
            if marker := keys.parse_active_marker(info.key):
                markers.setdefault(marker.job_id, []).append(info)
        return markers

    def _read_records(self, markers: dict[str, list[ObjectInfo]]) -> dict[str, JobView]:
        """Each recorded job's view, its record read again only when it may have changed (module docstring)."""
        reg = self._connection.registry
        listed = {job_id for folder in reg.folders(keys.JOBS) if (job_id := keys.parse_job_folder(folder))}
        out: dict[str, JobView] = {}
        with self._lock:
            cached = {job_id: self._records.get(job_id) for job_id in listed}
        fresh: dict[str, tuple[Token, JobView | None]] = {}
        for job_id in listed:
            found = markers.get(job_id)
            token: Token = tuple(sorted((m.key, m.version) for m in found)) if found else ()
            known = cached[job_id]
            if known is not None and known[0] == token and _settled(known[1], token):
                view = known[1]
            else:
                try:
                    view = JobView.of(reg.job(job_id))
                except (JobNotFound, UnreadableRecord):  # no record (yet: a code bundle's folder) or not readable
                    view = None
                fresh[job_id] = (token, view)
            if view is not None:
                out[job_id] = view
        with self._lock:
            self._records.update(fresh)
            for gone in set(self._records) - listed:
                del self._records[gone]
        return out

    def _read_drops(self, queued: list[tuple[str, datetime, int]], recorded: set[str]) -> list[JobView]:
        reg = self._connection.registry
        views, listed, seen = [], set(), set(recorded)
        for key, modified, _ in queued:
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
