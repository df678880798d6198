"""Metrics and stop rules read from output lines (jobplane.model.metrics): pure, table-driven."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobplane.agent.output import OutputLog
from jobplane.model import metrics
from jobplane.model.metrics import Extractor, Point, decode, encode
from jobplane.model.specfields import MetricDefinition, StopOn

NAN = float("nan")
# (line, the default metrics' points on it as (name, value)), with the step carried from line to line
DEFAULTS: list[tuple[str, list[tuple[str, float]]]] = [
    ("starting from step 0", [("step", 0)]),
    ("step 10 loss 0.693147", [("step", 10), ("loss", 0.693147)]),
    ("Step: 20, Loss: 0.5, Acc: 0.75, LR: 1e-3", [("step", 20), ("loss", 0.5), ("accuracy", 0.75),
                                                    ("learning_rate", 0.001)]),
    ("{'loss': 0.31, 'learning_rate': 5e-05, 'epoch': 0.1}", [("loss", 0.31), ("learning_rate", 5e-05)]),
    ("step=30 loss=.25 accuracy=0.9", [("step", 30), ("loss", 0.25), ("accuracy", 0.9)]),
    ("val_loss 0.3 train_loss 0.2 loss_scale 65536 lr_scheduler cosine", []),  # not the default names
    ("global_step 99 steps 3 epoch 2", []),
    ("step 40 loss nan", [("step", 40), ("loss", NAN)]),
    ("step 41 loss -Infinity", [("step", 41), ("loss", -math.inf)]),
    ("loss: 0.1. done", [("loss", 0.1)]),
    ("no metrics here", []),
]


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_default_metrics_line_by_line() -> None:
    extractor = Extractor()
    step = None
    for line, expected in DEFAULTS:
        points, stop = extractor.line(line + "\n")
        step = next((int(v) for n, v in expected if n == "step"), step)
        assert [p.name for p in points] == [n for n, _ in expected], line
        assert all(same(p.value, v) for p, (_, v) in zip(points, expected, strict=True)), (line, points)
        assert all(p.step == step for p in points) and stop is None, line


def test_the_demo_training_scripts_output_is_read_by_the_defaults() -> None:
    """examples/train/train.py prints `step N loss X`: its loss and step come out as points."""
    extractor = Extractor()
    points, _ = extractor.line("step 10 loss 2.348915\n")
    assert points == [Point("step", 10.0, 10), Point("loss", 2.348915, 10)]
    source = (Path(__file__).resolve().parents[2] / "examples" / "train" / "train.py").read_text()
    assert 'print(f"step {step} loss {loss:.6f}"' in source


def test_a_closing_summary_is_not_another_point_but_a_line_naming_its_step_is() -> None:
    """train.py ends with `done: {"steps": 150, "loss": ...}`: the loss of step 150 again, not a 151st point."""
    extractor = Extractor()
    assert [p.name for p in extractor.line("step 150 loss 0.012345\n")[0]] == ["step", "loss"]
    assert extractor.line('done: {"steps": 150, "loss": 0.0123451234, "weight_error": 0.1}\n')[0] == []
    # another value at the step is another point (HF Trainer's dict lines carry no step), as is a line naming its step
    assert extractor.line("{'loss': 0.0124}\n")[0] == [Point("loss", 0.0124, 150)]
    assert [p.name for p in extractor.line("step 150 loss 0.0124\n")[0]] == ["step", "loss"]
    assert extractor.line("accuracy 0.9\n")[0] == [Point("accuracy", 0.9, 150)]
    assert extractor.line("final accuracy 9.0e-1\n")[0] == []  # printed as 0.9 before
    fresh = Extractor()
    assert len(fresh.line("{'loss': 0.5}\n")[0] + fresh.line("{'loss': 0.5}\n")[0]) == 2  # no step: both count


def test_sagemaker_definitions_replace_the_defaults_and_a_step_metric_sets_the_step() -> None:
    extractor = Extractor([MetricDefinition(name="train:loss", regex=r"train_loss=([0-9.]+)"),
                           MetricDefinition(name="step", regex=r"it (\d+)/")])
    assert extractor.line("it 7/100 train_loss=0.42 loss 9") == ([Point("step", 7.0, 7), Point("train:loss", 0.42, 7)],
                                                                 None)
    assert extractor.line("step 99 loss 1") == ([], None)  # `step N` no longer sets the step, loss is not defined
    assert extractor.step == 7


def test_without_a_step_metric_the_step_still_comes_from_step_n() -> None:
    extractor = Extractor([MetricDefinition(name="val:acc", regex=r"val acc ([0-9.]+)")])
    assert extractor.line("step 5 val acc 0.8") == ([Point("val:acc", 0.8, 5)], None)


@pytest.mark.parametrize(("stop_on", "lines", "why"), [
    (StopOn(nan=True), ["step 1200 loss nan"], 'loss became nan at step 1200: "step 1200 loss nan"'),
    (StopOn(nan=True), ["step 3 loss 0.5", "loss inf"], 'loss became inf at step 3: "loss inf"'),
    (StopOn(nan=False), ["step 1 loss nan"], None),
    (StopOn(patterns=["CUDA out of memory", r"Traceback \(most"]), ["step 9", "  Traceback (most recent call last):"],
     """output matched 'Traceback \\(most' at step 9: "Traceback (most recent call last):\""""),
    (StopOn(patterns=["x"]), ["no match"], None),
    (StopOn(nan=True), ["loss NaN " + "y" * 500], 'loss became nan: "loss NaN ' + "y" * 191 + '..."'),
])
def test_stop_rules_quote_the_line_and_the_step(stop_on: StopOn, lines: list[str], why: str | None) -> None:
    extractor = Extractor(stop_on=stop_on)
    results = [extractor.line(line)[1] for line in lines]
    assert results[:-1] == [None] * (len(lines) - 1) and results[-1] == why


def test_work_per_line_is_bounded_by_max_line() -> None:
    extractor = Extractor(stop_on=StopOn(patterns=["MARK"]))
    assert extractor.line("x" * metrics.MAX_LINE + " loss 0.5 MARK") == ([], None)  # past the cut: not seen


def test_chunks_round_trip_with_nan_and_inf_as_strict_json() -> None:
    at = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    points = [Point("loss", 0.5, 10), Point("loss", NAN, 11), Point("lr", -math.inf, None)]
    data = b"".join(encode(p, at) for p in points)
    assert b"NaN" not in data and b'"value":"nan"' in data and b'"value":"-inf"' in data
    samples = decode(data + b"{torn\n", attempt=2, rank=1)
    assert [(s.name, s.step, s.attempt, s.rank, s.time) for s in samples] == [
        ("loss", 10, 2, 1, at), ("loss", 11, 2, 1, at), ("lr", None, 2, 1, at)]
    assert all(same(s.value, p.value) for s, p in zip(samples, points, strict=True))


def test_output_log_asks_to_stop_on_the_line_itself_not_at_a_flush() -> None:
    """The agent interrupts when the line is read: on_stop runs inside user(), before any take()."""
    out, asked = OutputLog(None), []
    out.watch(Extractor(stop_on=StopOn(nan=True)), asked.append)
    out.user(b"step 7 loss 0.1\n")
    assert asked == [] and out.step == 7
    out.user(b"step 8 loss nan\n")
    assert asked == ['loss became nan at step 8: "step 8 loss nan"']
    assert out.take() == b"step 7 loss 0.1\nstep 8 loss nan\n"
    points = [decode(line, 1, 0)[0] for line in out.take_points()]
    assert [(p.name, p.step) for p in points] == [("step", 7), ("loss", 7), ("step", 8), ("loss", 8)]

