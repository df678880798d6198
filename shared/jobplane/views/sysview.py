"""What people are shown of a job's system metrics (no I/O): a series per figure and rank, the dashboard's
charts (one per kind, a line per rank and GPU), the right-sizing hint and the GPU-hours spent idle."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from jobplane.model.metrics import Sample
from jobplane.model.sysmetrics import KINDS, Kind, gpu_of
from jobplane.views.metricview import Series

HINT_UTILIZATION = 30.0  # percent: GPUs that averaged under this could likely do with a smaller instance
HINT_MEMORY = 0.5  # share of a GPU's memory: peaks under this leave room for a GPU with less
IDLE_UTILIZATION = 10.0  # percent: a GPU-hour spent under this counts as idle in `jobplane cost --gpu-idle`
MAX_GAP = 3600.0  # seconds: a longer silence between two samples (a VM gone) counts for nothing


def _order(name: str) -> tuple[int, int, str]:
    gpu = gpu_of(name)
    kind = next((i for i, k in enumerate(KINDS) if k.matches(name)), len(KINDS))
    return kind, gpu[0] if gpu else -1, name


def series(samples: Iterable[Sample]) -> list[Series]:
    """Each figure of each rank, attempt after attempt, in the kinds' order (then GPU, then rank)."""
    by: dict[tuple[str, int], list[Sample]] = {}
    for sample in samples:
        by.setdefault((sample.name, sample.rank), []).append(sample)
    return [Series(name, rank, tuple(by[name, rank]))
            for name, rank in sorted(by, key=lambda key: (_order(key[0]), key[1]))]


def label(s: Series) -> str:
    """A series' name where every rank's are shown together: gpu0.utilization, cpu_percent [rank 1]."""
    return s.name + (f" [rank {s.rank}]" if s.rank else "")


@dataclass(frozen=True)
class Chart:
    """One kind's chart: x is seconds since the epoch (uPlot's), a line per series, None where it has no point."""

    kind: Kind
    labels: list[str]
    x: list[float]
    lines: list[list[float | None]]


def charts(all_series: Sequence[Series]) -> list[Chart]:
    """One chart per kind that has points, in the kinds' order; lines aligned on every time any of them has."""
    out = []
    for kind in KINDS:
        drawn = [s for s in all_series if kind.matches(s.name)]
        if not drawn:
            continue
        x = sorted({p.time.timestamp() for s in drawn for p in s.samples})
        lines = []
        for s in drawn:
            at = {p.time.timestamp(): p.value for p in s.samples}
            lines.append([at.get(t) for t in x])
        names = [label(s).replace(".utilization", "").replace(".memory_used_gb", "").replace(".power_w", "")
                 .replace(".temperature_c", "") for s in drawn]
        out.append(Chart(kind, names, x, lines))
    return out


def _mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def hint(samples: Sequence[Sample]) -> str | None:
    """The right-sizing hint of an ended job, from its GPUs' samples (every rank and attempt): their mean
    utilization and the highest memory any used against its total, when either says the GPUs were more than
    the job needed; None when they were busy, or there were no GPU samples."""
    utilization = _mean([s.value for s in samples if (g := gpu_of(s.name)) and g[1] == "utilization"])
    used = max((s.value for s in samples if (g := gpu_of(s.name)) and g[1] == "memory_used_gb"), default=None)
    total = max((s.value for s in samples if (g := gpu_of(s.name)) and g[1] == "memory_total_gb"), default=None)
    if utilization is None:
        return None
    idle = utilization < HINT_UTILIZATION
    roomy = used is not None and total is not None and total > 0 and used < HINT_MEMORY * total
    if not idle and not roomy:
        return None
    memory = f", memory {used:.0f} of {total:.0f} GB" if used is not None and total else ""
    advice = "a smaller instance may do" if idle else "a GPU with less memory may do"
    return f"GPU utilization averaged {utilization:.0f}%{memory}: {advice}"


def idle_gpu_hours(samples: Iterable[Sample], under: float = IDLE_UTILIZATION) -> float:
    """GPU-hours spent under `under` % utilization: each GPU's reading counts for the time since that GPU's
    reading before it (in the same attempt and rank), a silence over MAX_GAP for nothing."""
    last: dict[tuple[int, int, str], datetime] = {}
    seconds = 0.0
    for s in sorted(samples, key=lambda s: s.time):
        gpu = gpu_of(s.name)
        if gpu is None or gpu[1] != "utilization":
            continue
        key = (s.attempt, s.rank, s.name)
        before = last.get(key)
        last[key] = s.time
        if before is not None and s.value < under and (gap := (s.time - before).total_seconds()) <= MAX_GAP:
            seconds += gap
    return seconds / 3600
