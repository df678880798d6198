"""What the dashboard shows, read from the registry: the jobs table, a job's page, its logs and metrics, costs.

The jobs table is `jobplane ls` (jobview.view_row, the same facts), plus each job's owner, labels and name for
the filters. A page view lists jobs/, active/, queue/ and rejected/ and GETs only the records whose listing entry
(modified time, size) changed since the previous view, and the drops not seen before: job.json objects are
cached by their listing entry, so a dashboard left open on a registry of thousands of jobs makes no per-job GET
while nothing changes (bench/ui.py counts the calls).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jobplane import cost, jobs, keys, metricview
from jobplane.clouds.base import NotFound
from jobplane.jobview import JobView, rejected_reason, view_row
from jobplane.metrics import STEP
from jobplane.registry import JobRecord, Registry, utcnow
from jobplane.spec import spec_to_json
from jobplane.states import State

MASK = "••••••"  # what an env value shows as: spec env values may be secrets
LOG_TAIL_BYTES = 256 * 1024  # a log's first view: at most this much of its end (the rest is left out, said so)
CHUNK_CACHE = 2048  # log chunks kept in memory (immutable objects, by key)
COUNTED = (State.QUEUED, State.LAUNCHING, State.RUNNING, State.WAITING_CAPACITY, State.PREEMPTED)


def mask_env(doc: Any) -> Any:
    """The spec as JSON with every `env:` mapping's values masked (names kept), at any depth."""
    if isinstance(doc, dict):
        return {k: ({name: MASK for name in v} if k == "env" and isinstance(v, dict) else mask_env(v))
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [mask_env(v) for v in doc]
    return doc


@dataclass(frozen=True)
class Row:
    """A jobs-table row: `jobplane ls`'s columns (view_row) plus what the filters look at."""

    cells: dict[str, Any]
    owner: str
    labels: dict[str, str]
    name: str

    @property
    def id(self) -> str:
        return str(self.cells["id"])

    @property
    def state(self) -> str:
        return str(self.cells["state"])

    def matches(self, state: str, owner: str, label: str, text: str) -> bool:
        if state and self.state != state.upper():
            return False
        if owner and self.owner != owner:
            return False
        if label:
            k, _, v = label.partition("=")
            if k not in self.labels or (v and self.labels[k] != v):
                return False
        if text:
            hay = " ".join((self.id, self.name, str(self.cells.get("reason", "")), self.owner,
                            " ".join(f"{k}={v}" for k, v in self.labels.items()))).lower()
            if text.lower() not in hay:
                return False
        return True


def record_row(view: JobView, now: datetime) -> Row:
    spec = view.spec
    owner = view.record.owner if view.record else (spec.owner if spec else keys.DEFAULT_OWNER)
    return Row(view_row(view, now), owner, dict(spec.labels) if spec else {}, (spec.name or "") if spec else "")


@dataclass
class Board:
    """The registry as the dashboard reads it, with the records and drops it has already read cached by their
    listing entry. Thread-safe (the server answers from a thread pool)."""

    reg: Registry
    _records: dict[str, tuple[tuple[datetime, int], JobRecord]] = field(default_factory=dict)
    _drops: dict[str, tuple[datetime, JobView]] = field(default_factory=dict)
    _rejected: dict[str, tuple[datetime, str]] = field(default_factory=dict)
    _chunks: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- the jobs table ----------------------------------------------------------------------------
    def records(self) -> dict[str, JobRecord]:
        """Every recorded job, from one listing of jobs/; a record is read again only when its entry changed."""
        listed: dict[str, tuple[datetime, int]] = {}
        for key, modified, size in self.reg.listing(keys.JOBS):
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
                record = self.reg.job(job_id)
            except Exception:  # gone since the listing, or a record this version cannot read: not shown
                continue
            with self._lock:
                self._records[job_id] = (entry, record)
            out[job_id] = record
        with self._lock:
            for gone in set(self._records) - set(listed):
                del self._records[gone]
        return out

    def rows(self, include_done: bool, now: datetime | None = None) -> list[Row]:
        """As jobs.list_rows: live jobs (or all), drops still in queue/ and, with include_done, rejected ones."""
        now = now or utcnow()
        records = self.records()
        live = {job_id for job_id, markers in self.reg.active().items() if markers}
        rows = [record_row(JobView.of(r), now) for job_id, r in records.items()
                if include_done or job_id in live or r.state not in _ENDED]
        seen = set(records)
        drops_listed = set()
        for key, modified, _ in self.reg.listing(keys.QUEUE):
            drop = keys.parse_drop(key)
            if drop is None or drop.job_id in seen:
                continue
            drops_listed.add(key)
            with self._lock:
                cached = self._drops.get(key)
            if cached is None or cached[0] != modified:
                try:
                    view = jobs.queued_view(drop.job_id, key, self.reg.get_bytes(key), modified)
                except NotFound:
                    continue
                cached = (modified, view)
                with self._lock:
                    self._drops[key] = cached
            seen.add(drop.job_id)
            rows.append(record_row(cached[1], now))
        with self._lock:
            for gone in set(self._drops) - drops_listed:
                del self._drops[gone]
        if include_done:
            for key, modified, _ in self.reg.listing(keys.REJECTED):
                rejected = keys.parse_rejected_error(key)
                if not rejected or rejected in seen:
                    continue
                with self._lock:
                    known = self._rejected.get(key)
                if known is None or known[0] != modified:
                    try:
                        known = (modified, rejected_reason(self.reg.get_json(key)))
                    except (NotFound, ValueError):
                        continue
                    with self._lock:
                        self._rejected[key] = known
                rows.append(record_row(JobView(rejected, State.INVALID, modified, reason=known[1]), now))
        return sorted(rows, key=lambda r: r.cells["age"])

    def counts(self) -> dict[str, int]:
        """Live jobs by state, from one listing of active/ (and queue/'s drops, not yet recorded, as QUEUED)."""
        out = {str(s): 0 for s in COUNTED}
        recorded = set()
        for job_id, markers in self.reg.active().items():
            if markers:
                recorded.add(job_id)
                state = str(max(markers, key=lambda m: m.since).state)
                out[state] = out.get(state, 0) + 1
        for key, _, _ in self.reg.listing(keys.QUEUE):
            drop = keys.parse_drop(key)
            if drop is not None and drop.job_id not in recorded:
                out[str(State.QUEUED)] += 1
        return out

    # ---- a job's logs ------------------------------------------------------------------------------
    def chunk(self, key: str) -> str:
        with self._lock:
            if key in self._chunks:
                self._chunks.move_to_end(key)
                return self._chunks[key]
        text = self.reg.get_bytes(key).decode(errors="replace")
        with self._lock:
            self._chunks[key] = text
            while len(self._chunks) > CHUNK_CACHE:
                self._chunks.popitem(last=False)
        return text

    def log_since(self, job_id: str, attempt: int, rank: int, cursor: int | None) -> dict[str, Any]:
        """The output of one attempt and rank after the first `cursor` chunks; with no cursor (a first view),
        only its end: at most LOG_TAIL_BYTES, and how many chunks were left out before it."""
        found = [key for _, _, key in jobs.node_chunks(self.reg, "logs", job_id, attempt, rank)]
        skipped = 0
        if cursor is None:
            start, size = len(found), 0
            while start > 0:
                text = self.chunk(found[start - 1])
                if size + len(text) > LOG_TAIL_BYTES and start < len(found):
                    break
                size += len(text)
                start -= 1
            skipped = start
        else:
            start = max(0, min(cursor, len(found)))
        text = "".join(self.chunk(k) for k in found[start:])
        return {"text": text, "cursor": len(found), "skipped": skipped}


_ENDED = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.TIMED_OUT, State.STALLED, State.INVALID})


# ---- a job's page ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attempt:
    number: int
    instance_type: str
    market: str
    zone: str
    instances: list[str]
    cost: str
    ranks: list[int]


def attempts(record: JobRecord, now: datetime) -> list[Attempt]:
    out = []
    for used in record.usage:
        out.append(Attempt(used.attempt, used.instance_type, str(used.market), used.zone or "-",
                           [span.id for span in used.instances], cost.money(cost.attempt_cost(used, now)),
                           list(range(len(used.instances) or record.spec.num_nodes))))
    return out


def timeline(events: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The event history as (time, kind, state, detail) strings, oldest first."""
    out = []
    for ev in events:
        detail = {k: v for k, v in ev.items() if k not in ("time", "kind", "spec", "to", "from")}
        text = str(detail.pop("reason", "") or "")
        rest = ", ".join(f"{k}: {v}" for k, v in detail.items() if v not in (None, "", [], {}))
        out.append({"time": str(ev.get("time", ""))[:19].replace("T", " "), "kind": str(ev.get("kind", "")),
                    "state": str(ev.get("to") or ev.get("state") or ""),
                    "detail": "; ".join(t for t in (text, rest) if t)})
    return out


def stored_files(reg: Registry, prefix: str, limit: int = 200) -> tuple[list[tuple[str, int]], int, int]:
    """(relative key, size) of the objects under prefix (at most limit of them), their count and total size."""
    files: list[tuple[str, int]] = []
    count, total = 0, 0
    for key, _, size in reg.listing(prefix):
        count += 1
        total += size
        if len(files) < limit:
            files.append((key.removeprefix(prefix), size))
    return files, count, total


def human_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def metric_data(reg: Registry, job_id: str) -> dict[str, Any]:
    """Each metric (from the lowest rank that printed it) as uPlot's aligned data: x = step (or the point's
    index when it has none), one series per attempt so attempts show apart. The step itself is the x axis, not a
    chart."""
    out: dict[str, Any] = {}
    for s in metricview.series(jobs.read_metrics(reg, job_id)):
        if s.name == STEP:
            continue
        by_attempt: dict[int, dict[float, float | None]] = {}
        for i, sample in enumerate(s.samples):
            x = float(sample.step) if sample.step is not None else float(i)
            value = sample.value if sample.value == sample.value and abs(sample.value) != float("inf") else None
            by_attempt.setdefault(sample.attempt, {})[x] = value
        xs = sorted({x for points in by_attempt.values() for x in points})
        out[s.name] = {"x": xs, "attempts": sorted(by_attempt), "points": len(s.samples), "rank": s.rank,
                       "series": [[by_attempt[a].get(x) for x in xs] for a in sorted(by_attempt)]}
    return out


def compare_data(reg: Registry, job_ids: list[str], metric: str) -> dict[str, Any]:
    """One metric of several jobs, over their steps (the lowest rank's, every attempt), aligned for uPlot."""
    per_job: dict[str, dict[float, float | None]] = {}
    names: set[str] = set()
    for job_id in job_ids:
        points: dict[float, float | None] = {}
        with contextlib.suppress(NotFound):
            for s in metricview.series(jobs.read_metrics(reg, job_id)):
                names.add(s.name)
                if s.name != metric:
                    continue
                for i, sample in enumerate(s.samples):
                    x = float(sample.step) if sample.step is not None else float(i)
                    ok = sample.value == sample.value and abs(sample.value) != float("inf")
                    points[x] = sample.value if ok else None
        per_job[job_id] = points
    xs = sorted({x for p in per_job.values() for x in p})
    return {"x": xs, "jobs": list(per_job), "series": [[p.get(x) for x in xs] for p in per_job.values()],
            "metrics": sorted(names)}


def spec_json(view: JobView) -> dict[str, Any] | None:
    return mask_env(spec_to_json(view.spec)) if view.spec else None
