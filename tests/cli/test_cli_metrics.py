"""`jobplane metrics` (table, --json, --plot), `describe`'s metric lines and `submit --hp`, through click over a
registry on each cloud (moto's S3 in-process, the GCS fake). The metric chunks are written as an agent writes
them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from jobplane.model import keys
from jobplane.model.metrics import Point
from jobplane.store.registry import Registry
from tests.cli.helpers import run
from tests.helpers import falling, ship
from tests.registry_clouds import RegistryCloud, recorded

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def trained(registry_cloud: RegistryCloud, reg: Registry) -> str:
    """A job preempted at step 120 that resumed from step 100 on attempt 2 and diverged at step 160."""
    recorded(registry_cloud, "trained")
    ship(reg, "trained", 1, 0, 0, falling(range(10, 70, 10)))
    ship(reg, "trained", 1, 0, 1, [*falling(range(70, 130, 10)), Point("accuracy", 0.8, 120)])
    ship(reg, "trained", 2, 0, 0, [*falling(range(100, 160, 10)), Point("loss", math.nan, 160)])
    ship(reg, "trained", 1, 1, 0, [Point("loss", 99.0, 10)])  # rank 1 prints its own loss: not mixed in
    return "trained"


def test_metrics_table_shows_last_min_max_and_the_trend_across_attempts(trained: str) -> None:
    result = run("metrics", trained)
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.output.splitlines()[1:] if line.strip()}
    loss = lines["loss"]  # METRIC LAST STEP MIN MAX POINTS ATTEMPTS TREND
    assert loss[:3] == ["loss", "nan", "160"] and loss[5:7] == ["19", "1,2"]
    assert float(loss[3]) == pytest.approx(8 * 0.97 ** 150, rel=1e-5)  # min: the last finite value
    assert float(loss[4]) == pytest.approx(8 * 0.97 ** 10, rel=1e-5)
    assert loss[7].count("|") == 1 and loss[7].endswith("!")  # attempts split by |, the NaN shown
    assert lines["step"][1:3] == ["150", "150"] and lines["accuracy"][1] == "0.8"


def test_metrics_json_has_every_point_of_one_rank(trained: str) -> None:
    result = run("metrics", trained, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    loss = next(m for m in doc["metrics"] if m["name"] == "loss")
    assert loss["rank"] == 0 and loss["count"] == 19 and loss["last"] == "nan" and loss["attempts"] == [1, 2]
    assert [p[:2] for p in loss["points"][:2]] == [[1, 10], [1, 20]] and loss["points"][-1][2] == "nan"
    only = json.loads(run("metrics", trained, "--json", "--rank", "1", "--attempt", "1").output)
    assert [(m["name"], m["rank"], m["last"]) for m in only["metrics"]] == [("loss", 1, 99.0)]


def test_metrics_plot_writes_a_png_with_one_panel_per_metric(trained: str, tmp_path: Path) -> None:
    out = tmp_path / "loss.png"
    result = run("metrics", trained, "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "loss 19 points, accuracy 1 points" in result.output  # step is the x axis, not a panel


def test_describe_shows_each_metrics_last_value(trained: str) -> None:
    result = run("describe", trained)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "metrics step 150 at step 150 (min 10, max 150, 18 points) loss nan at step 160 (min 0.08" in text
    assert "accuracy 0.8 at step 120 (min 0.8, max 0.8, 1 points)" in text
    doc = json.loads(run("describe", trained, "--json").output)
    assert [m["name"] for m in doc["metrics"]] == ["step", "loss", "accuracy"] and "points" not in doc["metrics"][0]


def test_a_job_without_metrics_says_so(registry_cloud: RegistryCloud, tmp_path: Path) -> None:
    recorded(registry_cloud, "quiet")
    result = run("metrics", "quiet")
    assert result.exit_code == 0 and "job quiet (LAUNCHING): no metrics yet; they come with its log chunks" in \
        result.output
    plotted = run("metrics", "quiet", "--plot", str(tmp_path / "x.png"))
    assert plotted.exit_code == 1 and "no metrics to plot for quiet" in plotted.output
    assert run("metrics", "nope").output.strip() == "Error: no job 'nope'"


def test_plot_without_matplotlib_is_one_clear_line(trained: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = run("metrics", trained, "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 1
    assert result.output.strip().endswith("Error: --plot needs matplotlib: pip install 'jobplane[plot]'")


def test_submit_hp_overrides_the_spec_in_the_drop(registry_cloud: RegistryCloud, reg: Registry, tmp_path: Path) -> None:
    spec = tmp_path / "hp.yaml"
    spec.write_text(registry_cloud.spec("hyperparameters: {epochs: 10, lr: 0.01}\n"))
    result = run("submit", str(spec), "--id", "hp-job", "--hp", "lr=0.02", "--hp", "optimizer=adam")
    assert result.exit_code == 0, result.output
    drop = yaml.safe_load(reg.get_bytes(keys.queue_entry("hp-job")))
    assert drop["hyperparameters"] == {"epochs": 10, "lr": 0.02, "optimizer": "adam"}
    bad = run("submit", str(spec), "--id", "hp-bad", "--hp", "lr")
    assert bad.exit_code == 2 and "'lr' is not NAME=VALUE" in bad.output
    refused = run("submit", str(spec), "--id", "hp-bad", "--hp", "1lr=3")
    assert refused.exit_code == 1 and "hyperparameters.1lr: '1lr' is not a valid hyperparameter name" in refused.output
