"""`jobplane metrics --plot` (views.plot, through matplotlib's Agg backend): what gets a panel."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobplane.views import plot as plotting
from jobplane.views import sysview
from tests.views.test_sysview import samples

pytest.importorskip("matplotlib", reason="--plot needs the plot extra (pip install 'jobplane[plot]')")


def test_a_system_plot_gives_panels_to_figures_over_time_and_puts_constant_totals_in_its_title(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"cpu_percent": 10.0 + i, "memory_used_gb": 20.0 + i, "memory_total_gb": 64.0, "disk_used_gb": 30.0,
             "disk_total_gb": 100.0} for i in range(4)]
    titles: list[str] = []
    from matplotlib.figure import Figure
    real = Figure.suptitle
    monkeypatch.setattr(Figure, "suptitle", lambda fig, t, **kw: titles.append(t) or real(fig, t, **kw))
    drawn = plotting.plot(sysview.series([*samples(rows), *samples(rows[:2], rank=1)]), tmp_path / "s.png", "job")
    assert list(drawn) == ["cpu_percent", "memory_used_gb", "disk_used_gb"]  # each for ranks 0 and 1
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert titles == ["job\ndisk_total_gb 100, disk_total_gb [rank 1] 100, memory_total_gb 64, "
                      "memory_total_gb [rank 1] 64"]
    growing = [{"memory_total_gb": 64.0 + i} for i in range(3)]  # a total that changes is a figure over time
    assert list(plotting.plot(sysview.series(samples(growing)), tmp_path / "g.png", "job")) == ["memory_total_gb"]
