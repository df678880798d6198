"""Series, summaries and sparklines of stored metric samples (jobplane.views.metricview): pure."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from jobplane.model.metrics import Sample
from jobplane.views.metricview import cells, last_line, series, sparkline, summary

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
NAN, INF = float("nan"), float("inf")


def sample(name: str, value: float, step: int | None, attempt: int = 1, rank: int = 0) -> Sample:
    return Sample(attempt, rank, T0 + timedelta(seconds=step or 0), name, value, step)


@pytest.mark.parametrize(("segments", "width", "line"), [
    ([[1, 2, 3, 4, 5, 6, 7, 8]], 40, "▁▂▃▄▅▆▇█"),
    ([[8, 7, 6, 5, 4, 3, 2, 1]], 4, "▇▅▃▁"),  # pairs averaged: 7.5 5.5 3.5 1.5 on the 1..8 scale
    ([[3, 3, 3]], 40, "▅▅▅"),  # flat: the middle bar
    ([[5, 4, 3], [4, 2, 1]], 40, "█▆▅|▆▃▁"),  # attempts on one scale, | between them
    ([[4, 3, NAN, 2]], 2, "▆!"),  # a NaN is never averaged away
    ([[1, INF]], 40, "▅!"),  # one finite value: flat
    ([[NAN]], 40, "!"),
    ([], 40, ""),
])
def test_sparkline(segments: list[list[float]], width: int, line: str) -> None:
    assert sparkline(segments, width) == line


def test_sparkline_stays_near_its_width_with_many_points_and_attempts() -> None:
    line = sparkline([list(range(1000)), list(range(10)), list(range(500))], 40)
    assert len(line) <= 42 and line.count("|") == 2
    assert all(len(part) >= 1 for part in line.split("|"))


def test_series_take_each_metric_from_one_rank_in_first_seen_order() -> None:
    samples = [sample("loss", 1.0, 1, rank=0), sample("loss", 9.0, 1, rank=1), sample("acc", 0.5, 1, rank=1),
               sample("loss", 0.5, 2, rank=0), sample("loss", 0.7, 3, attempt=2, rank=0)]
    got = series(samples)
    assert [(s.name, s.rank, s.values()) for s in got] == [("loss", 0, [1.0, 0.5, 0.7]), ("acc", 1, [0.5])]
    assert [(s.name, s.rank) for s in series(samples, rank=1)] == [("loss", 1), ("acc", 1)]
    assert got[0].attempts == [1, 2]


def test_summary_and_lines_for_a_job_that_diverged() -> None:
    (loss,) = series([sample("loss", 2.0, 10), sample("loss", 0.5, 20), sample("loss", 1.0, 20, attempt=2),
                      sample("loss", NAN, 30, attempt=2)])
    row = summary(loss, points=True)
    assert {k: row[k] for k in ("last", "last_step", "min", "max", "count", "attempts")} == {
        "last": "nan", "last_step": 30, "min": 0.5, "max": 2.0, "count": 4, "attempts": [1, 2]}
    assert row["trend"] == "█▁|▃!" and row["points"][-1] == [2, 30, "nan", (T0 + timedelta(seconds=30)).isoformat()]
    assert last_line(loss) == "nan at step 30 (min 0.5, max 2, 4 points)"
    assert cells(loss) == ["loss", "nan", "30", "0.5", "2", "4", "1,2", "█▁|▃!"]


def test_a_metric_without_steps_or_finite_values() -> None:
    (lr,) = series([sample("lr", NAN, None, rank=2)])
    assert cells(lr) == ["lr [rank 2]", "nan", "-", "-", "-", "1", "1", "!"]
    assert last_line(lr) == "nan (1 points)" and math.isnan(lr.last.value)
