"""The Compare page's data: which jobs a search or filter finds (by text, sweep, array or label, from the records a
Watch keeps), and one metric of the jobs chosen, overlaid. Only the chosen jobs' metrics are read (at most
MAX_CHOSEN): the page costs the same at 1,000 jobs as at 10, but for the records the jobs table reads anyway."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobplane import sdk
from jobplane.model.metrics import STEP
from jobplane.model.states import State
from jobplane.ui.data import Row, plotted

MAX_CHOSEN = 20  # jobs on one chart: more lines than a legend can tell apart, and a read of each one's metrics
SHOWN = 50  # matching jobs listed to pick from: a search narrows the rest


@dataclass(frozen=True)
class Found:
    """What the filters found: the first SHOWN matches (newest first), how many matched, and the sweeps and arrays
    the jobs belong to, for the filters' lists."""

    shown: list[Row]
    matched: int
    sweeps: list[str]
    arrays: list[str]


def comparable(row: Row) -> bool:
    """A job that may have metrics: one the launcher recorded (not a drop still queued, nor an INVALID one)."""
    return row.view.record is not None and row.view.state != State.INVALID


def find(rows: Sequence[Row], text: str, sweep: str, array: str, label: str) -> Found:
    kept = [row for row in rows if comparable(row)]
    sweeps = sorted({v for row in kept if (v := row.labels.get("sweep"))})
    arrays = sorted({v for row in kept if (v := row.labels.get("array"))})
    matched = [row for row in kept
               if (not sweep or row.labels.get("sweep") == sweep) and (not array or row.labels.get("array") == array)
               and (not (label or text) or row.matches("", "", label, text))]
    return Found(matched[:SHOWN], len(matched), sweeps, arrays)


def overlay(client: sdk.Client, job_ids: Sequence[str], metric: str) -> dict[str, Any]:
    """One metric of the jobs over their steps (the lowest rank's, every attempt), aligned for uPlot; `metrics`,
    each metric the jobs have with how many of them have it, the most shared first. Each job's metrics are read
    once; with no metric (or one none has), the most shared is drawn."""
    read: dict[str, dict[str, sdk.Metric]] = {}
    for job_id in job_ids:
        try:
            read[job_id] = {k: v for k, v in client.get(job_id).metrics().items() if k != STEP}
        except (sdk.JobNotFound, sdk.NotYours):
            read[job_id] = {}
    shared = Counter(name for metrics in read.values() for name in metrics)
    names = sorted(shared, key=lambda name: (-shared[name], name))
    if metric not in shared and names:
        metric = names[0]
    per_job: dict[str, dict[float, float | None]] = {}
    for job_id, metrics in read.items():
        points: dict[float, float | None] = {}
        if metric in metrics:
            for by_x in plotted(metrics[metric].points).values():
                points.update(by_x)
        per_job[job_id] = points
    xs = sorted({x for p in per_job.values() for x in p})
    return {"metric": metric, "x": xs, "jobs": list(per_job), "metrics": [(name, shared[name]) for name in names],
            "series": [[p.get(x) for x in xs] for p in per_job.values()]}
