"""What is shown of a job's system metrics, from given samples: the right-sizing hint's wording and figures, the
GPU-hours spent idle, the series' order and the dashboard's charts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobplane.model import sysmetrics
from jobplane.model.metrics import Sample
from jobplane.views import sysview

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def samples(rows: list[dict[str, float]], *, attempt: int = 1, rank: int = 0, every: float = 15) -> list[Sample]:
    """The samples as an agent stores and the registry hands them back (encode, then decode)."""
    data = b"".join(sysmetrics.encode(T0 + timedelta(seconds=i * every), row) for i, row in enumerate(rows))
    return sysmetrics.decode(data, attempt, rank)


def gpus(utilization: float, used: float, total: float = 24, n: int = 1) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in range(n):
        out |= {f"gpu{i}.utilization": utilization, f"gpu{i}.memory_used_gb": used, f"gpu{i}.memory_total_gb": total}
    return out


def test_idle_gpus_get_the_smaller_instance_hint_with_the_figures() -> None:
    rows = [gpus(10, 8.2), gpus(30, 9.0), gpus(14, 7.5)]  # a mean of 18 %, at most 9 of 24 GB
    assert sysview.hint(samples(rows)) == "GPU utilization averaged 18%, memory 9 of 24 GB: a smaller instance may do"


def test_busy_gpus_that_use_little_memory_get_the_less_memory_hint() -> None:
    rows = [gpus(95, 20, total=80), gpus(85, 30, total=80)]
    assert sysview.hint(samples(rows)) == "GPU utilization averaged 90%, memory 30 of 80 GB: a GPU with less memory " \
                                          "may do"


def test_busy_gpus_with_full_memory_and_no_gpus_get_no_hint() -> None:
    assert sysview.hint(samples([gpus(92, 70, total=80), gpus(88, 71, total=80)])) is None
    assert sysview.hint(samples([{"cpu_percent": 3.0, "memory_used_gb": 1.0}])) is None  # a CPU job
    assert sysview.hint([]) is None


def test_the_hint_averages_every_gpu_of_every_rank_and_attempt() -> None:
    # rank 0's eight GPUs busy, rank 1's eight idle on attempt 1; attempt 2 (rank 0) idle: mean (96*8 + 0*8 + 0*8)/24
    mixed = [*samples([gpus(96, 30, 80, n=8)]), *samples([gpus(0, 20, 80, n=8)], rank=1),
             *samples([gpus(0, 20, 80, n=8)], attempt=2)]
    assert sysview.hint(mixed) == "GPU utilization averaged 32%, memory 30 of 80 GB: a GPU with less memory may do"
    mixed += samples([gpus(0, 20, 80, n=8)], attempt=2, rank=1)  # now 96*8/32
    assert sysview.hint(mixed) == "GPU utilization averaged 24%, memory 30 of 80 GB: a smaller instance may do"


def test_idle_gpu_hours_count_each_gpu_between_its_readings_under_ten_percent() -> None:
    # two GPUs, a reading every 15 s for an hour: GPU 0 idle throughout, GPU 1 idle in the second half hour
    rows = [gpus(0, 1) | {"gpu1.utilization": 5.0 if i > 120 else 60.0} for i in range(241)]
    assert sysview.idle_gpu_hours(samples(rows)) == pytest.approx(1.5)
    # an attempt's rank counts on its own: its first reading starts its clock, and a gap over an hour is no time
    later = samples([gpus(0, 1), gpus(0, 1)], attempt=2, every=7200)
    assert sysview.idle_gpu_hours([*samples(rows), *later]) == pytest.approx(1.5)


def test_series_come_in_the_kinds_order_and_charts_align_every_rank_and_gpu() -> None:
    node0 = samples([{"gpu1.utilization": 50.0, "gpu0.utilization": 40.0, "cpu_percent": 10.0, "net_in_mb_s": 1.0}])
    node1 = samples([{"cpu_percent": 20.0}, {"cpu_percent": 30.0}], rank=1, every=15)
    shown = sysview.series([*node1, *node0])
    assert [sysview.label(s) for s in shown] == ["cpu_percent", "cpu_percent [rank 1]", "net_in_mb_s",
                                                  "gpu0.utilization", "gpu1.utilization"]
    charts = {c.kind.key: c for c in sysview.charts(shown)}
    assert list(charts) == ["cpu", "network", "gpu"]
    cpu = charts["cpu"]
    assert cpu.labels == ["cpu_percent", "cpu_percent [rank 1]"]
    assert cpu.x == [T0.timestamp(), T0.timestamp() + 15] and cpu.lines == [[10.0, None], [20.0, 30.0]]
    assert charts["gpu"].labels == ["gpu0", "gpu1"] and charts["gpu"].kind.unit == "%"


def test_a_sample_is_bounded_and_a_torn_line_is_skipped() -> None:
    many = {f"gpu{i}.{name}": 123.456789 for i in range(60) for name in ("utilization", "power_w")}
    line = sysmetrics.encode(T0, {"cpu_percent": float("nan"), **many})
    assert len(line) < 4096 and b"nan" not in line
    decoded = sysmetrics.decode(line + line[:50], 1, 0)  # a second line cut short
    assert len(decoded) == sysmetrics.MAX_VALUES - 1 and decoded[0].value == 123.5


def test_a_chart_draws_each_attempt_apart_across_a_preemptions_gap() -> None:
    first = samples([{"cpu_percent": 10.0}, {"cpu_percent": 20.0}])
    second = [Sample(2, s.rank, s.time + timedelta(minutes=10), s.name, s.value + 50, None)
              for s in samples([{"cpu_percent": 30.0}, {"cpu_percent": 40.0}])]
    cpu = sysview.charts(sysview.series([*first, *second]))[0]
    t = T0.timestamp()
    assert cpu.x == [t, t + 15, t + 600, t + 615]
    assert cpu.labels == ["cpu_percent · attempt 1", "cpu_percent · attempt 2"] and cpu.attempts == [1, 2]
    assert cpu.lines == [[10.0, 20.0, None, None], [None, None, 80.0, 90.0]]  # no line joins 20 to 80
    alone = sysview.charts(sysview.series(first))[0]
    assert alone.labels == ["cpu_percent"] and alone.attempts == [1]


def test_a_chart_of_small_values_is_in_a_unit_they_reach_one_in() -> None:
    def network(mb_s: float) -> sysview.Chart:
        rows = [{"net_in_mb_s": mb_s, "net_out_mb_s": mb_s / 2}, {"net_in_mb_s": 0.0, "net_out_mb_s": 0.0}]
        return next(c for c in sysview.charts(sysview.series(samples(rows))) if c.kind.key == "network")

    assert (network(12.5).unit, network(12.5).lines[0]) == ("MB/s", [12.5, 0.0])
    kb = network(0.0042)
    assert kb.unit == "KB/s" and kb.labels == ["received", "sent"]
    assert kb.lines == [[pytest.approx(4.2), 0.0], [pytest.approx(2.1), 0.0]]
    assert network(0.0000031).unit == "B/s" and network(0.0).unit == "MB/s"
    memory = sysview.charts(sysview.series(samples([{"memory_used_gb": 0.25}])))[0]
    assert (memory.unit, memory.lines) == ("MB", [[250.0]])
