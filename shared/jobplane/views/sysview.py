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
    """One kind's chart: x is seconds since the epoch (uPlot's), a line per series and attempt (`attempts`: each
    line's), None where it has no point; values in `unit`, the kind's own scaled to their range (scaled())."""

    kind: Kind
    labels: list[str]
    x: list[float]
    lines: list[list[float | None]]
    attempts: list[int]
    unit: str


# Units a kind's own may step down to, with their factor, largest first: a network chart of a few KB/s reads as
# KB/s, not as 0.001, 0, 0 MB/s.
SMALLER = {"MB/s": (("MB/s", 1.0), ("KB/s", 1e3), ("B/s", 1e6)), "GB": (("GB", 1.0), ("MB", 1e3))}


def scaled(unit: str, lines: Sequence[Sequence[float | None]]) -> tuple[str, float]:
    """The unit to show values of `unit` in and the factor to multiply them by: the largest whose values reach 1."""
    top = max((abs(v) for line in lines for v in line if v is not None), default=0.0)
    ladder = SMALLER.get(unit, ((unit, 1.0),))
    return next(((name, factor) for name, factor in ladder if top * factor >= 1), ladder[-1] if top else ladder[0])


def charts(all_series: Sequence[Series]) -> list[Chart]:
    """One chart per kind that has points, in the kinds' order; lines aligned on every time any of them has. Each
    attempt of a series is its own line (Series.lives, as `metrics --plot` draws them): an attempt after a
    preemption is not joined to the one before it across the gap."""
    out = []
    for kind in KINDS:
        drawn = [s for s in all_series if kind.matches(s.name)]
        if not drawn:
            continue
        x = sorted({p.time.timestamp() for s in drawn for p in s.samples})
        several = any(len(s.attempts) > 1 for s in drawn)
        lines, names, attempts = [], [], []
        for s in drawn:
            name = (label(s).replace(".utilization", "").replace(".memory_used_gb", "").replace(".power_w", "")
                    .replace(".temperature_c", "").replace("net_in_mb_s", "received").replace("net_out_mb_s", "sent"))
            for attempt, points in s.lives():
                at = {p.time.timestamp(): p.value for p in points}
                lines.append([at.get(t) for t in x])
                names.append(f"{name} · attempt {attempt}" if several else name)
                attempts.append(attempt)
        unit, factor = scaled(kind.unit, lines)
        if factor != 1:
            lines = [[v * factor if v is not None else None for v in line] for line in lines]
        out.append(Chart(kind, names, x, lines, attempts, unit))
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
