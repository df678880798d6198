"""Training-aware jobs on the local cloud (real moto, bootstrap, agents and handlers): a loss that turns NaN
stops the job FAILED with the line, its checkpoint synced and no rerun; a SageMaker script runs unchanged
with its hyperparameters, channel and metric definitions; `jobplane metrics` reads back what the agents
extracted, and --plot draws it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jobplane.clouds.s3 import S3Store
from jobplane.local.aws import DATA_BUCKET
from jobplane.local.demo import REPO, CloudProcess, exit_report, wait_for_no_instances
from jobplane.model import keys
from jobplane.model.states import State
from tests.helpers import data_of
from tests.local.conftest import TRAIN, cli_ok

pytestmark = pytest.mark.scenario
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs


def submit(cloud: CloudProcess, spec: str, code: Path, *args: str) -> str:
    return cli_ok(cloud, "submit", str(REPO / spec), "--code", str(code), *args).strip().splitlines()[-1]


def wait_terminal(cloud: CloudProcess, job_id: str, timeout: int = 180) -> int:
    done = cloud.cli("wait", job_id, "--timeout", f"{timeout}s", timeout=timeout + 30)
    assert done.returncode != 124, f"{job_id} did not end within {timeout}s: {done.stderr}"
    return done.returncode


@pytest.mark.timeout(300)
def test_a_loss_that_turns_nan_stops_the_job_failed_with_the_line_its_checkpoint_synced_no_rerun(
        cloud: CloudProcess) -> None:
    job_id = submit(cloud, "examples/demo-nan.yaml", TRAIN)  # 100000 steps, NaN from step 110
    assert wait_terminal(cloud, job_id) == 1  # FAILED
    reg = cloud.registry()
    record = reg.job(job_id)
    why = 'train:loss became nan at step 110: "step 110 loss nan"'
    assert record.state == State.FAILED and record.reason == f"stopped: {why}"
    assert record.attempt == 1 and record.restarts == 0  # a Spot job with restarts left: not rerun
    report = exit_report(reg, job_id, 1) or {}
    assert (report.get("reason"), report.get("error")) == ("early-stop", why)
    assert not reg.preempted()
    checkpoints = {k.rsplit("/", 1)[-1] for k, _, _ in reg.listing(keys.checkpoints_prefix(data_of(reg, job_id)))}
    assert "ckpt-100.npz" in checkpoints  # the last checkpoint before the NaN, synced by the graceful stop
    logs = cli_ok(cloud, "logs", job_id)
    assert f"stop_on: {why}" in logs and "early-stop: SIGTERM to the process group" in logs

    table = cli_ok(cloud, "metrics", job_id)
    row = next(line.split() for line in table.splitlines() if line.split()[:1] == ["train:loss"])
    assert row[1:3] == ["nan", "110"] and row[-1].endswith("!")  # last value, its step, the trend ends in NaN
    described = cli_ok(cloud, "describe", job_id)
    assert "train:loss nan at step 110" in described
    assert wait_for_no_instances(cloud, 120) == []
    assert not any(k.startswith(keys.attempt_prefix(job_id, 2)) for k, _, _ in reg.listing(keys.job_prefix(job_id)))


@pytest.mark.timeout(300)
def test_a_sagemaker_script_runs_unchanged_with_its_hyperparameters_channel_and_metrics(
        cloud: CloudProcess, tmp_path: Path) -> None:
    reg = cloud.registry()
    data = (REPO / "examples" / "sagemaker-data" / "train.csv").read_bytes()
    S3Store(DATA_BUCKET, reg.store.client).put("blobs/train.csv", data, "text/csv")  # the spec's train channel
    job_id = submit(cloud, "examples/sagemaker.yaml", REPO / "examples" / "sagemaker", "--hp", "epochs=12")
    assert wait_terminal(cloud, job_id) == 0, reg.job(job_id).reason

    logs = cli_ok(cloud, "logs", job_id)
    file_line = next(line for line in logs.splitlines() if line.startswith("hyperparameters.json: "))
    assert json.loads(file_line.split(": ", 1)[1]) == {"epochs": "12", "lr": "0.05", "batch_size": "16"}
    assert "training: epochs=12 lr=0.05 batch_size=16 data=" in logs  # SM_HP_* reached argparse's defaults
    assert re.search(r"data=\S+/input/data/train$", logs, re.M)
    model = json.loads(reg.get_bytes(keys.artifacts_prefix(data_of(reg, job_id)) + "model/model.json"))
    assert model["epochs"] == 12

    doc = json.loads(cli_ok(cloud, "metrics", job_id, "--json"))
    found = {m["name"]: m for m in doc["metrics"]}
    loss, accuracy = found["train:loss"], found["train:accuracy"]
    assert loss["count"] == 12 and loss["last_step"] == 180  # 240 rows / batch 16 = 15 steps per epoch
    values = [p[2] for p in loss["points"]]
    assert values[0] > values[-1] and values == sorted(values, reverse=True)  # the loss falls every epoch
    assert accuracy["last"] >= 0.8

    png = tmp_path / "sagemaker.png"
    done = cloud.cli("metrics", job_id, "--plot", str(png))
    assert done.returncode == 0, done.stderr
    assert f"wrote {png}: train:loss 12 points, train:accuracy 12 points" in done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
