"""What a sweep's pages show, read through the SDK (Client.sweeps, Sweep.describe): the sweeps table, a sweep's
trials (best first) and one scatter per parameter of its value against the objective.

The scatters are drawn server-side as SVG (as the cost page's bars are HTML): each trial that has reported the
objective is a dot, linking to its job, the search range of the parameter on the x axis (log for a loguniform
one, a choice's values in order), the objective on the y axis shared by every chart (log when every value is
above 0 and they span two decades or more: a diverged trial would flatten the rest).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobplane import sdk
from jobplane.model.states import TERMINAL
from jobplane.sweeps.record import SweepRecord
from jobplane.views import cost
from jobplane.views.jobview import human_duration

# A chart's size in SVG units, and its plot area's margins (the axes' labels go in them).
WIDTH, HEIGHT = 300, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 10, 34
LOG_SPAN = 100.0  # objectives all above 0 whose max / min reaches this get a log y axis
CHOICE_LABEL = 12  # characters of a choice's value shown under its tick


@dataclass(frozen=True)
class Scale:
    """Maps a value in [lo, hi] (in log space when log) to [0, 1]."""

    lo: float
    hi: float
    log: bool = False

    def at(self, value: float) -> float:
        lo, hi, v = (math.log10(self.lo), math.log10(self.hi), math.log10(value)) if self.log else \
            (self.lo, self.hi, value)
        return min(1.0, max(0.0, (v - lo) / (hi - lo))) if hi > lo else 0.5

    def ticks(self) -> list[float]:
        """Where the axis is labelled: each decade of a log scale (its ends when it spans less than one), else
        about 4 round numbers."""
        if self.log:
            decades = [10.0 ** k for k in range(math.ceil(math.log10(self.lo)), math.floor(math.log10(self.hi)) + 1)]
            return decades if len(decades) >= 2 else [self.lo, *decades, self.hi]
        span = self.hi - self.lo
        if span <= 0:
            return [self.lo]
        raw = span / 4
        step = min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
        first = math.ceil(self.lo / step - 1e-9)
        return [float(f"{k * step:.12g}") for k in range(first, math.floor(self.hi / step + 1e-9) + 1)]


def padded(values: Sequence[float], log: bool) -> Scale:
    """A scale around the values, 5% of their span to spare on each side (in log space for log)."""
    lo, hi = min(values), max(values)
    if log:
        spare = (math.log10(hi) - math.log10(lo)) * 0.05 or 0.5
        return Scale(10 ** (math.log10(lo) - spare), 10 ** (math.log10(hi) + spare), log=True)
    spare = (hi - lo) * 0.05 or (abs(lo) * 0.1 or 1.0)
    return Scale(lo - spare, hi + spare)


def number(value: float) -> str:
    return f"{value:.3g}"


def value_text(value: Any) -> str:
    """A parameter's value as the table shows it: a float to 4 significant digits, anything else as JSON."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class Dot:
    number: int
    job_id: str
    x: float  # SVG units
    y: float
    kind: str  # final: a SUCCEEDED trial's result; live: its latest value so far; ended: stopped or failed
    best: bool
    title: str


@dataclass(frozen=True)
class Tick:
    at: float  # SVG units along its axis
    text: str


@dataclass(frozen=True)
class Scatter:
    """One parameter against the objective."""

    parameter: str
    kind: str  # uniform, loguniform, int or choice
    log_x: bool
    log_y: bool
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    dots: list[Dot]
    metric: str
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    plot_w: int = WIDTH - LEFT - RIGHT
    plot_h: int = HEIGHT - TOP - BOTTOM


def _x(at: float) -> float:
    return round(LEFT + at * (WIDTH - LEFT - RIGHT), 1)


def _y(at: float) -> float:
    return round(TOP + (1 - at) * (HEIGHT - TOP - BOTTOM), 1)


def scatters(record: SweepRecord, trials: Sequence[sdk.TrialRow]) -> list[Scatter]:
    """One scatter per parameter of the sweep (record: its SweepRecord, as Sweep.record), in the spec's order,
    of the trials that have reported a finite objective."""
    sweep = record.sweep
    shown = [t for t in trials if t.objective is not None and math.isfinite(t.objective)]
    if not shown:
        return []
    objectives = [float(t.objective) for t in shown if t.objective is not None]
    log_y = min(objectives) > 0 and max(objectives) / min(objectives) >= LOG_SPAN
    y = padded(objectives, log_y)
    y_ticks = [Tick(_y(y.at(v)), number(v)) for v in y.ticks()]
    best = record.best.job_id if record.best else None
    out = []
    for name, dist in sweep.parameters.items():
        kind = dist.kind
        dots = []
        if dist.choice is not None:
            values = [json.dumps(v, sort_keys=True) for v in dist.choice]
            place = {v: (i + 0.5) / len(values) for i, v in enumerate(values)}
            x_ticks = [Tick(_x(place[v]), value_text(c)[:CHOICE_LABEL]) for v, c in zip(values, dist.choice,
                                                                                        strict=True)]
        else:
            bounds = dist.uniform or dist.loguniform or dist.integer
            assert bounds is not None, "a distribution that is not a choice has a range"
            lo, hi = bounds
            x = Scale(float(lo), float(hi), log=kind == "loguniform") if hi > lo else padded([float(lo)], False)
            x_ticks = [Tick(_x(x.at(v)), number(v)) for v in x.ticks()]
        for t in shown:
            if name not in t.params or t.objective is None:
                continue
            value = t.params[name]
            if kind == "choice":
                at = place.get(json.dumps(value, sort_keys=True))
            elif isinstance(value, int | float) and not isinstance(value, bool):
                at = x.at(float(value))
            else:
                at = None
            if at is None:
                continue
            ended = t.state is not None and t.state in TERMINAL
            dots.append(Dot(t.number, t.job_id, _x(at), _y(y.at(t.objective)),
                            "final" if t.final else ("ended" if ended else "live"), t.job_id == best,
                            f"trial {t.number} ({t.job_id}): {name} = {value_text(value)}, "
                            f"{sweep.objective.metric} {t.objective:.6g}"
                            + ("" if t.final else f" ({'latest' if not ended else str(t.state).lower()})")))
        out.append(Scatter(name, kind, kind == "loguniform", log_y, x_ticks, y_ticks, dots, sweep.objective.metric))
    return out


# ---- the pages' rows -----------------------------------------------------------------------------------------
def sweep_row(found: sdk.Sweep, now: datetime) -> dict[str, Any]:
    """The sweeps table's row: from the record alone (one read per sweep, no trial's job)."""
    record, sweep = found.record, found.record.sweep
    return {"id": found.id, "state": str(found.state), "strategy": sweep.strategy,
            "objective": f"{sweep.objective.metric} ({sweep.objective.goal})", "trials": len(record.trials),
            "max_trials": sweep.trial_count, "best": found.best, "owner": record.owner,
            "age": human_duration((now - record.created_at).total_seconds()), "reason": record.reason or ""}


def trial_rows(record: SweepRecord, trials: Sequence[sdk.TrialRow]) -> list[dict[str, Any]]:
    """The trials table, best first (as Sweep.describe orders them)."""
    names = list(record.sweep.parameters)
    out = []
    for t in trials:
        stopped = record.stopped.get(t.job_id)
        out.append({"number": t.number, "job_id": t.job_id, "params": [value_text(t.params.get(n, "")) for n in names],
                    "objective": f"{t.objective:.6g}" if t.objective is not None else "-", "final": t.final,
                    "state": str(t.state) if t.state is not None else "PROPOSED",
                    "stopped": stopped is not None, "cost": cost.money(t.cost) if t.cost.usd or t.state else "-",
                    "reason": stopped or t.reason or "", "best": record.best is not None
                    and t.job_id == record.best.job_id})
    return out
