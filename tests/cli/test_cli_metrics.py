"""`jobplane metrics` (table, --json, --plot, --system), `describe`'s metric lines and right-sizing hint, `cost
--gpu-idle` and `submit --hp`, through click over a registry on each cloud (moto's S3 in-process, the GCS fake).
The metric and system metric chunks are written as an agent writes them."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.metrics import Point
from jobplane.model.states import State
from jobplane.model.usage import AttemptUsage, InstanceSpan
from jobplane.store.registry import Registry
from tests.cli.helpers import run
from tests.helpers import falling, gpu_sample, ship, ship_system
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
    table = run("metrics", trained, "--rank", "1").output  # the rank is text in the table, not rich markup
    assert next(line.split() for line in table.splitlines() if "loss" in line)[:4] == ["loss", "[rank", "1]", "99"]


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


@pytest.fixture
def sampled(registry_cloud: RegistryCloud, reg: Registry) -> str:
    """A two-node job that ended after half an hour on each node's one GPU at 10-30 % utilization (9 of 24 GB),
    rank 1's second GPU idle, and one sample of attempt 2 on rank 0; priced, so that cost counts it."""
    started = utcnow() - timedelta(hours=1)
    usage = AttemptUsage(attempt=1, instance_type="g5.xlarge", market="on-demand", price=1.0, price_source="policy",
                         instances=[InstanceSpan(id="i-1", start=started, end=started + timedelta(minutes=30))])
    recorded(registry_cloud, "sampled", usage=[usage])
    reg.transition("sampled", State.RUNNING)
    half_hour = [gpu_sample(10 + 20 * (i % 2), 9.0) for i in range(121)]  # 18 % on average, at most 9 GB
    ship_system(reg, "sampled", 1, 0, 0, half_hour[:60])
    ship_system(reg, "sampled", 1, 0, 1, half_hour[60:], first=60 * 15)
    ship_system(reg, "sampled", 1, 1, 0, [gpu_sample(5.0, 1.0, gpus=2) for _ in range(121)])
    reg.transition("sampled", State.SUCCEEDED, reason="exit 0")
    return "sampled"


def test_metrics_system_shows_each_ranks_figures_apart_from_the_jobs_metrics(sampled: str) -> None:
    result = run("metrics", sampled, "--system")
    assert result.exit_code == 0, result.output
    rows = {line.split("  ")[0].strip(): line.split() for line in result.output.splitlines()[1:] if line.strip()}
    assert list(rows)[:3] == ["cpu_percent", "cpu_percent [rank 1]", "memory_used_gb"], result.output
    util = rows["gpu0.utilization"]  # METRIC LAST STEP MIN MAX POINTS ATTEMPTS TREND
    assert util[1:7] == ["10", "-", "10", "30", "121", "1"] and len(util[7]) > 10
    assert rows["gpu1.utilization [rank 1]"][3:8] == ["5", "-", "5", "5", "121"]
    doc = json.loads(run("metrics", sampled, "--system", "--json").output)
    power = next(m for m in doc["system_metrics"] if m["name"] == "gpu0.power_w" and m["rank"] == 1)
    assert power["count"] == 121 and power["points"][0][2] == 75.0
    assert run("metrics", sampled).output.strip() == f"job {sampled} (SUCCEEDED): no metrics yet"


def test_describe_gives_an_ended_jobs_right_sizing_hint(sampled: str) -> None:
    # rank 0's GPU averaged 20 % over 121 readings (10 and 30 by turns), rank 1's two 5 %: (20*121 + 5*242) / 363
    hint = "GPU utilization averaged 10%, memory 9 of 24 GB: a smaller instance may do"
    result = run("describe", sampled)
    assert result.exit_code == 0 and f"right-sizing {hint}" in " ".join(result.output.split())
    assert json.loads(run("describe", sampled, "--json").output)["right_sizing"] == hint


def test_cost_sums_gpu_hours_under_ten_percent_by_owner(sampled: str, registry_cloud: RegistryCloud) -> None:
    recorded(registry_cloud, "no-samples")  # no usage, no system metrics: not a row
    result = run("cost", "--by", "owner", "--gpu-idle", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["owner"] == "default" and row["gpu_idle_hours"] == 1.0  # rank 1's two GPUs, half an hour each
    table = run("cost", "--gpu-idle")
    assert "GPU-H <10%" in table.output and "1.00" in table.output
    assert "gpu_idle_hours" not in run("cost", "--json").output


def test_tensorboard_without_the_package_is_one_clear_line(sampled: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    result = run("tensorboard", sampled)
    assert result.exit_code == 1
    assert result.output.strip() == "Error: jobplane tensorboard needs the tensorboard package: pip install " \
                                    "'jobplane[tensorboard]'"
