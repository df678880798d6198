"""What `jobplane metrics` and `describe` show of a job's training metrics: series, summaries and sparklines
built from the samples its agents stored (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobplane.model.metrics import Sample

BARS = "▁▂▃▄▅▆▇█"
NOT_FINITE = "!"  # a NaN or Inf in a sparkline
SPARK_WIDTH = 40


@dataclass(frozen=True)
class Series:
    """One metric as one rank printed it, attempt after attempt, in the order it was printed."""

    name: str
    rank: int
    samples: tuple[Sample, ...]

    @property
    def last(self) -> Sample:
        return self.samples[-1]

    @property
    def attempts(self) -> list[int]:
        return sorted({s.attempt for s in self.samples})

    def lives(self) -> list[tuple[int, list[Sample]]]:
        """Each attempt's samples, the attempts in order: a chart draws each its own line, never one line across
        the gap between them (a preemption's), as `metrics --plot` and the dashboard's system charts do."""
        return [(attempt, [s for s in self.samples if s.attempt == attempt]) for attempt in self.attempts]

    def values(self, attempt: int | None = None) -> list[float]:
        return [s.value for s in self.samples if attempt is None or s.attempt == attempt]

    @property
    def finite(self) -> list[float]:
        return [v for v in self.values() if math.isfinite(v)]


def series(samples: Iterable[Sample], rank: int | None = None) -> list[Series]:
    """Each metric from `rank`, else from the lowest rank that printed it (rank 0 usually logs for all; mixing
    ranks would zigzag), in the order the metrics first appear. Samples come in (attempt, rank, printed) order."""
    by_name: dict[str, dict[int, list[Sample]]] = {}
    for sample in samples:
        if rank is None or sample.rank == rank:
            by_name.setdefault(sample.name, {}).setdefault(sample.rank, []).append(sample)
    return [Series(name, min(ranks), tuple(ranks[min(ranks)])) for name, ranks in by_name.items()]


def sparkline(segments: Sequence[Sequence[float]], width: int = SPARK_WIDTH) -> str:
    """Values as bars on one scale (min to max of the finite ones), each segment (an attempt) its share of about
    `width` characters, joined by |. A run of values squeezed into one bar shows their mean; one with a NaN
    or Inf shows ! (a divergence must not be averaged away)."""
    segments = [s for s in segments if s]
    finite = [v for s in segments for v in s if math.isfinite(v)]
    lo, hi = min(finite, default=0.0), max(finite, default=0.0)
    total = sum(len(s) for s in segments)
    room = max(len(segments), width - (len(segments) - 1))
    parts = []
    for values in segments:
        n = min(len(values), max(1, round(room * len(values) / total)))
        parts.append("".join(_bar(bucket, lo, hi) for bucket in _buckets(values, n)))
    return "|".join(parts)


def _buckets(values: Sequence[float], n: int) -> list[list[float]]:
    """values in n contiguous runs of (nearly) equal length, in order."""
    return [list(values[i * len(values) // n:(i + 1) * len(values) // n]) for i in range(n)]


def _bar(bucket: list[float], lo: float, hi: float) -> str:
    if not all(math.isfinite(v) for v in bucket):
        return NOT_FINITE
    mean = sum(bucket) / len(bucket)
    if hi == lo:
        return BARS[len(BARS) // 2]
    return BARS[round((mean - lo) / (hi - lo) * (len(BARS) - 1))]


def summary(s: Series, points: bool = False) -> dict[str, Any]:
    """One metric as plain data (NaN and Inf as strings, as JSON has no such numbers); with points, every
    sample as [attempt, step, value, time]."""
    finite = s.finite
    row: dict[str, Any] = {
        "name": s.name, "rank": s.rank, "last": json_value(s.last.value), "last_step": s.last.step,
        "min": min(finite, default=None), "max": max(finite, default=None), "count": len(s.samples),
        "attempts": s.attempts, "trend": sparkline([s.values(a) for a in s.attempts]),
    }
    if points:
        row["points"] = [[p.attempt, p.step, json_value(p.value), p.time.isoformat()] for p in s.samples]
    return row


COLUMNS = ("METRIC", "LAST", "STEP", "MIN", "MAX", "POINTS", "ATTEMPTS", "TREND")


def cells(s: Series) -> list[str]:
    """A row of `jobplane metrics`'s table."""
    from jobplane.model.metrics import value_text  # the models load when a command shows metrics

    finite = s.finite
    numbers = (s.last.value, *((min(finite), max(finite)) if finite else (None, None)))
    last, low, high = ("-" if v is None else value_text(v) for v in numbers)
    return [s.name + (f" [rank {s.rank}]" if s.rank else ""), last, "-" if s.last.step is None else str(s.last.step),
            low, high, str(len(s.samples)), ",".join(map(str, s.attempts)),
            sparkline([s.values(a) for a in s.attempts])]


def json_value(value: float) -> float | str:
    from jobplane.model.metrics import value_text  # the models load when a command shows metrics

    return value if math.isfinite(value) else value_text(value)


def last_line(s: Series) -> str:
    """`describe`'s line for a metric: 0.0123 at step 200 (min 0.0119, max 8.31, 21 points)."""
    from jobplane.model.metrics import value_text  # the models load when a command shows metrics

    finite = s.finite
    at = f" at step {s.last.step}" if s.last.step is not None else ""
    spread = f"min {value_text(min(finite))}, max {value_text(max(finite))}, " if finite else ""
    return f"{value_text(s.last.value)}{at} ({spread}{len(s.samples)} points)"
