"""Training metrics read from a job's output, and the stop rules checked on it: pure, one line at a time.

The agent hands every line its user processes print to an Extractor, which returns the metric points found
on it (name, value, the current step) and, if a `stop_on` rule matched, why the job must stop. Points are
stored as JSON Lines chunks under teams/<owner>/<id>/metrics/<attempt>/<rank>/ (encode / decode here), read back by
`jobplane metrics` and `describe`.

The work per line is bounded: a line is cut to MAX_LINE characters before any regex sees it, and a spec has
at most 40 metrics and 20 stop patterns (bench/metrics_extract.py measures the cost).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobplane.model.specfields import MetricDefinition, StopOn
from jobplane.model.states import EARLY_STOP as EARLY_STOP  # in states.py: the check reads it without the spec

MAX_LINE = 2048  # characters of a line that metrics and stop patterns look at
STEP = "step"  # the metric whose value is the step the other points carry
# A number as training loops print it, NaN and Inf included (any case): 0.5, -3, 1e-4, .5, nan, inf, -Infinity
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
# between a key and its value: `loss 0.5`, `loss: 0.5`, `loss=0.5`, `'loss': 0.5` (a printed dict)
_SEP = r"""['"]?\s*[:=]?\s*"""
STEP_REGEX = rf"(?i)\bstep{_SEP}(\d+)"  # step 120, Step: 120, step=120, 'step': 120 (not global_step, steps)
# What applies when a spec names no metrics. \b keeps val_loss, loss_scale and lr_scheduler out.
DEFAULT_METRICS: tuple[MetricDefinition, ...] = (
    MetricDefinition(name="loss", regex=rf"(?i)\bloss{_SEP}({NUMBER})"),
    MetricDefinition(name="accuracy", regex=rf"(?i)\b(?:accuracy|acc){_SEP}({NUMBER})"),
    MetricDefinition(name="learning_rate", regex=rf"(?i)\b(?:learning[ _]rate|lr){_SEP}({NUMBER})"),
    MetricDefinition(name=STEP, regex=STEP_REGEX),
)
QUOTE_MAX = 200  # characters of the matching line a stop reason quotes


@dataclass(frozen=True)
class Point:
    name: str
    value: float  # NaN and Inf included: they are what a stop rule looks for
    step: int | None  # the latest step seen on or before this line


class Extractor:
    """Reads a user process's output one line at a time and keeps the latest step.

    metrics None means DEFAULT_METRICS. The step comes from the metric named `step` if there is one, else
    from `step N` in the output (so heartbeats carry a step whatever the metrics)."""

    def __init__(self, metrics: Sequence[MetricDefinition] | None = None, stop_on: StopOn | None = None) -> None:
        definitions = DEFAULT_METRICS if metrics is None else tuple(metrics)
        step = next((d for d in definitions if d.name == STEP), None)
        self._step = re.compile(step.regex if step else STEP_REGEX)
        self._step_is_metric = step is not None
        self._rules = [(d.name, re.compile(d.regex)) for d in definitions if d.name != STEP]
        self._patterns = [re.compile(p) for p in stop_on.patterns] if stop_on else []
        self._nan = stop_on is not None and stop_on.nan
        self.step: int | None = None
        self._last: dict[str, tuple[int, str]] = {}  # each metric's latest point: its step and the number as printed

    def line(self, text: str) -> tuple[list[Point], str | None]:
        """The points on this line, and why the job must stop (None: it need not)."""
        text = text[:MAX_LINE].rstrip("\r\n")
        points = []
        found = self._step.search(text)
        step = number(found.group(1)) if found else None
        own_step = step is not None and math.isfinite(step)
        if step is not None and own_step:
            self.step = int(step)
            if self._step_is_metric:
                points.append(Point(STEP, float(self.step), self.step))
        for name, regex in self._rules:
            found = regex.search(text)
            if found and (value := number(found.group(1))) is not None:
                if not own_step and self._restates(name, value):
                    continue
                points.append(Point(name, value, self.step))
                if self.step is not None:
                    self._last[name] = (self.step, found.group(1))
        return points, self._stop(points, text)

    def _restates(self, name: str, value: float) -> bool:
        """A line without a step of its own that gives a metric the value its point at this step already has, at
        the precision that point was printed with (train.py's closing `done: {"loss": 0.0123451234, ...}` after
        `step 150 loss 0.012345`), restates that point rather than adding another."""
        step, printed = self._last.get(name, (None, ""))
        if step is None or step != self.step or not math.isfinite(value):
            return False
        mantissa, _, exponent = printed.lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        last = number(printed)
        return last is not None and abs(value - last) <= 0.5 * 10.0 ** (int(exponent or 0) - decimals)

    def _stop(self, points: list[Point], text: str) -> str | None:
        at = f" at step {self.step}" if self.step is not None else ""
        if self._nan:
            bad = next((p for p in points if not math.isfinite(p.value)), None)
            if bad is not None:
                return f"{bad.name} became {value_text(bad.value)}{at}: {quote(text)}"
        for pattern in self._patterns:
            if pattern.search(text):
                return f"output matched '{pattern.pattern}'{at}: {quote(text)}"
        return None


def number(text: str | None) -> float | None:
    """A captured value as a float; a trailing . , ; : ) as in `loss 0.5.` or `(acc 0.9)` is ignored."""
    if text is None:
        return None
    for candidate in (text, text.rstrip(".,;:)")):
        try:
            return float(candidate)
        except ValueError:
            continue
    return None


def value_text(value: float) -> str:
    """nan, inf, -inf, or the number to 6 significant digits (0.0123457, 1200, 5e-05)."""
    return f"{value:.6g}"


def quote(text: str) -> str:
    text = text.strip()
    return json.dumps(text if len(text) <= QUOTE_MAX else text[:QUOTE_MAX] + "...", ensure_ascii=False)


# ---- chunks: one JSON object per line ----------------------------------------------------------------------
def encode(point: Point, at: datetime) -> bytes:
    """A point as a line of JSON; NaN and Inf as the strings "nan", "inf", "-inf" (JSON has no such numbers)."""
    value: float | str = point.value if math.isfinite(point.value) else value_text(point.value)
    return (json.dumps({"time": at.isoformat(), "metric": point.name, "value": value, "step": point.step},
                       separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True)
class Sample:
    """A point read back from the registry, with where it came from."""

    attempt: int
    rank: int
    time: datetime
    name: str
    value: float
    step: int | None


def decode(data: bytes, attempt: int, rank: int) -> list[Sample]:
    """The samples of one chunk; a line that is not a point (a torn write, a future field's type) is skipped."""
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            row: Any = json.loads(line)
            step = row.get("step")
            out.append(Sample(attempt, rank, datetime.fromisoformat(row["time"]), str(row["metric"]),
                              float(row["value"]), int(step) if step is not None else None))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return out
