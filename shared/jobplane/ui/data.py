"""What the dashboard shows, read through the SDK (jobplane.sdk.Client): the jobs table, a job's page, its metrics.

The jobs table is `jobplane ls` (jobview.view_row, the same facts), plus each job's owner, labels and name for
the filters, from a Watch (Client.watch): a page view makes listings, and reads only the records whose listing
entry changed since the previous view (bench/ui.py counts the calls). Its first page also shows the jobs that
ended within RECENT, so a job that ends while nobody looks is still there when someone does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobplane import sdk
from jobplane.model.jobrecord import JobRecord
from jobplane.model.metrics import STEP
from jobplane.model.spec import spec_to_json
from jobplane.views import cost, jobview, sysview
from jobplane.views.jobview import JobView, view_cell, view_row

MASK = "••••••"  # what an env value shows as: spec env values may be secrets
RECENT = timedelta(hours=24)  # the first page's ended jobs: this recent (SageMaker's console, `sky jobs queue` too)


def mask_env(doc: Any) -> Any:
    """The spec as JSON with every `env:` mapping's values masked (names kept), at any depth."""
    if isinstance(doc, dict):
        return {k: ({name: MASK for name in v} if k == "env" and isinstance(v, dict) else mask_env(v))
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [mask_env(v) for v in doc]
    return doc


class Row:
    """A jobs-table row: `jobplane ls`'s columns (view_row) plus what the filters look at. A column is computed when
    asked for (cell: the filters' and the sort's, for every row), the whole row once shown (cells: only the rows a
    page renders), so a table of 10,000 jobs prices and times only the 500 it shows. One small object a job (slots,
    the spec's own labels): a view's rows are all alive at once, and what survives the collector's young
    generations makes it walk every cached record again."""

    __slots__ = ("_cells", "now", "owner", "view")

    def __init__(self, job: sdk.Job, now: datetime) -> None:
        self.view, self.now, self.owner = job.view, now, job.owner
        self._cells: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return self.view.id

    @property
    def state(self) -> str:
        return str(self.view.state)

    @property
    def ended(self) -> bool:  # shown muted
        return self.view.terminal

    @property
    def labels(self) -> Mapping[str, str]:
        return self.view.spec.labels if self.view.spec else {}

    @property
    def name(self) -> str:
        return (self.view.spec.name or "") if self.view.spec else ""

    @property
    def cells(self) -> dict[str, Any]:
        if self._cells is None:
            self._cells = view_row(self.view, self.now)
        return self._cells

    def cell(self, col: str) -> Any:
        return self._cells[col] if self._cells is not None else view_cell(self.view, col, self.now)

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
            hay = " ".join((self.id, self.name, str(self.cell("reason")), self.owner,
                            " ".join(f"{k}={v}" for k, v in self.labels.items()))).lower()
            if text.lower() not in hay:
                return False
        return True


def ended_at(view: JobView) -> datetime:
    """When an ended job ended: its record's last write (the end's, or a later close of its usage), or its rejection."""
    return view.record.updated_at if view.record is not None else view.since


def rows(listed: list[sdk.Job], include_done: bool, now: datetime, recent: timedelta = timedelta(0)) -> list[Row]:
    """The table's rows, the newest first, from a look with every job (Watch.look(True)): what `jobplane ls [--all]`
    lists, and without include_done the jobs that ended within `recent` too."""
    if not include_done:
        listed = [job for job in listed if not job.view.terminal or ended_at(job.view) > now - recent]
    # the newest first: the latest `since` (a record's creation, a drop's or a rejection's time) is the least age
    return [Row(job, now) for job in sorted(listed, key=lambda job: job.view.since, reverse=True)]


def sort_rows(rows: list[Row], col: str, desc: bool) -> list[Row]:
    """The rows by one column, rows without a value last either way. One value a row (a number or a string: no
    key tuple a row), computed once even where it is the cost."""
    if col == "age":  # the time since each job's `since`: ordered by that, with no clock arithmetic a row
        return sorted(rows, key=lambda row: row.view.since, reverse=not desc)
    values = [row.cell(col) for row in rows]
    present = [i for i, v in enumerate(values) if v is not None]
    present.sort(key=values.__getitem__, reverse=desc)
    return [rows[i] for i in present] + [row for row, v in zip(rows, values, strict=True) if v is None]


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


def readable(value: Any) -> str:
    """A field of an event as a person reads it: a list as its items, a mapping as `key value` pairs, a number
    without trailing zeros; never Python's repr (`['i-1']`)."""
    if isinstance(value, list | tuple):
        return ", ".join(readable(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {readable(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def timeline(events: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The event history as (time, kind, state, detail) strings, oldest first: the detail is the reason, then
    each other field that has a value as `name value` (a price as per hour)."""
    out = []
    for ev in events:
        detail = {k: v for k, v in ev.items() if k not in ("time", "kind", "spec", "to", "from", "state")}
        text = str(detail.pop("reason", "") or "")
        rest = " · ".join(f"{k.replace('_', ' ')} " + (f"${v:g}/h" if k == "price" and isinstance(v, float)
                                                          else readable(v))
                          for k, v in detail.items() if v not in (None, "", [], {}))
        out.append({"time": str(ev.get("time", ""))[:19].replace("T", " "), "kind": str(ev.get("kind", "")),
                    "state": str(ev.get("to") or ev.get("state") or ""),
                    "detail": " · ".join(t for t in (text, rest) if t)})
    return out


def status_line(view: JobView, now: datetime) -> str:
    """What the page says beside the state's badge: `jobplane describe`'s status without the state it starts
    with (the badge says it), and the reason once."""
    text = jobview.status(view, now).text
    state = str(view.state)
    if text.lower().startswith(state.lower()):
        text = text[len(state):].lstrip(": ")
    if view.reason and view.reason not in text:
        text = f"{text}: {view.reason}" if text else view.reason
    return text


def plotted(samples: list[sdk.Sample]) -> dict[int, dict[float, float | None]]:
    """Points by attempt, then by x: the step (or the point's index when it has none); NaN and Inf as gaps."""
    by_attempt: dict[int, dict[float, float | None]] = {}
    for i, sample in enumerate(samples):
        x = float(sample.step) if sample.step is not None else float(i)
        value = sample.value if sample.value == sample.value and abs(sample.value) != float("inf") else None
        by_attempt.setdefault(sample.attempt, {})[x] = value
    return by_attempt


def metric_data(job: sdk.Job) -> dict[str, Any]:
    """Each metric (from the lowest rank that printed it) as uPlot's aligned data: x = step (or the point's
    index when it has none), one series per attempt so attempts show apart. The step itself is the x axis, not a
    chart."""
    out: dict[str, Any] = {}
    for name, metric in job.metrics().items():
        if name == STEP:
            continue
        by_attempt = plotted(metric.points)
        xs = sorted({x for points in by_attempt.values() for x in points})
        out[name] = {"x": xs, "attempts": sorted(by_attempt), "points": len(metric.points), "rank": metric.rank,
                     "series": [[by_attempt[a].get(x) for x in xs] for a in sorted(by_attempt)]}
    return out


def system_data(job: sdk.Job) -> list[dict[str, Any]]:
    """The job's system metrics as uPlot's aligned data, one chart per kind (CPU, memory, disk, network, GPU
    utilization, memory, power, temperature): x = seconds since the epoch, a line per rank (and GPU) and attempt,
    in a unit its values' range suits."""
    charts = sysview.charts([m.series for m in job.metrics(system=True).values()])
    return [{"key": c.kind.key, "title": f"{c.kind.title} ({c.unit})", "x": c.x, "labels": c.labels,
             "series": c.lines, "attempts": c.attempts,
             "points": sum(v is not None for line in c.lines for v in line)} for c in charts]


def spec_json(view: JobView) -> dict[str, Any] | None:
    return mask_env(spec_to_json(view.spec)) if view.spec else None
