"""`jobplane metrics ID --plot out.png`: a PNG line chart of a job's metrics, one panel per metric.

matplotlib is an optional extra (`pip install 'jobplane[plot]'`), imported only here and only when a plot
is asked for; it draws with the Agg backend (no display needed) through a Figure of its own, so no global
pyplot state is touched.
"""

from __future__ import annotations

import math
from pathlib import Path

from jobplane.model.metrics import STEP
from jobplane.views.metricview import Series

INSTALL = "pip install 'jobplane[plot]'"
LOG_SCALE_RATIO = 100  # a positive metric spanning more than this (a falling loss) gets a log y axis


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def constant_total(s: Series) -> bool:
    """A system figure that is a machine's size (memory_total_gb, disk_total_gb, gpu0.memory_total_gb) and never
    changed: worth a number, not a panel of a flat line."""
    return "_total_" in s.name and len(set(s.finite)) == 1


def plot(all_series: list[Series], path: Path, title: str) -> dict[str, int]:
    """Write the chart; returns the points drawn per metric. Step is the x axis (seconds since the first point
    when a metric has no step), so the step metric itself is not drawn unless it is all there is.

    Each attempt is its own line in a panel, with a dashed mark where it starts: a resumed attempt picks up
    at its checkpoint's step. NaN and Inf points are marked with a red x at the top of their panel. A system
    figure that is a machine's unchanging size (constant_total) is a number in the title, not a panel."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(f"--plot needs matplotlib: {INSTALL}") from None
    shown = [s for s in all_series if s.name != STEP] or all_series
    totals = [s for s in shown if constant_total(s)]  # a machine's size, not a figure over time: in the title
    if totals and len(totals) < len(shown):
        shown = [s for s in shown if s not in totals]
        title += "\n" + ", ".join(f"{s.name}{f' [rank {s.rank}]' if s.rank else ''} {s.finite[0]:g}" for s in totals)
    if not shown:
        raise ValueError("no metrics to plot")
    by_step = all(p.step is not None for s in shown for p in s.samples)
    start = min(p.time for s in shown for p in s.samples)
    fig = Figure(figsize=(9, 1.2 + 2.4 * len(shown)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
    for ax, s in zip(axes, shown, strict=True):
        for attempt, points in s.lives():
            xs = [float(p.step) if by_step and p.step is not None else (p.time - start).total_seconds()
                  for p in points]
            ys = [p.value if math.isfinite(p.value) else math.nan for p in points]
            line, = ax.plot(xs, ys, marker="." if len(points) <= 60 else None, linewidth=1.4,
                            label=f"attempt {attempt}")
            if attempt != s.attempts[0]:
                ax.axvline(xs[0], color=line.get_color(), linestyle="--", linewidth=1)
            bad = [x for x, p in zip(xs, points, strict=True) if not math.isfinite(p.value)]
            if bad:
                ax.plot(bad, [1.0] * len(bad), "x", color="red", markersize=9, transform=ax.get_xaxis_transform(),
                        clip_on=False, label="nan / inf")
        finite = s.finite
        if finite and min(finite) > 0 and max(finite) / min(finite) > LOG_SCALE_RATIO:
            ax.set_yscale("log")
        ax.set_ylabel(s.name)
        ax.grid(alpha=0.3)
        if len(s.attempts) > 1 or any(not math.isfinite(v) for v in s.values()):
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # off the lines
    axes[-1].set_xlabel("step" if by_step else "seconds since the first point")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    return {s.name: len(s.samples) for s in shown}
