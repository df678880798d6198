"""The agent's side of idle GPUs: a rank's mean GPU utilization over the window cluster.json gives, written as
its `.idle` mark with each heartbeat while it is under the threshold; and a stop request's author copied into
the exit report, so the sweeper can tell an idle-GPU stop from the uptime cap's."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobplane import keys
from jobplane.agent import Agent, AgentConfig
from jobplane.agent.idle import IdleMeter
from jobplane.clouds.aws_imds import Ec2Metadata
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID, NotFound
from jobplane.clouds.memory import MemoryStore
from jobplane.local.imds import FakeImds, ImdsInstance
from jobplane.records import ClusterFile, IdleWatch, StopRequest
from jobplane.registry import Registry
from jobplane.spec import JobSpec
from jobplane.states import State
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(60)


def test_the_meter_is_idle_only_after_a_whole_window_of_low_readings() -> None:
    meter = IdleMeter(window=60, threshold=5)
    for t in range(0, 60, 10):
        meter.add(t, 1.0)
        assert meter.idle(t) is None  # the readings do not cover the window yet
    meter.add(60, 3.0)
    assert meter.idle(60) == pytest.approx(9 / 7)  # six readings of 1 and one of 3
    meter.add(70, 90.0)  # busy again: the window's mean climbs over the threshold
    assert meter.idle(70) is None
    meter.add(80, None)  # no reading (no GPU, or another phase): start over
    for t in range(90, 150, 10):
        meter.add(t, 0.0)
        assert meter.idle(t) is None
    meter.add(150, 0.0)
    assert meter.idle(150) == 0.0


def seed(reg: Registry, window: float) -> None:
    reg.create_job("gpu-job", JobSpec(instance_type="g5.xlarge", run="echo training; sleep 60"))
    reg.transition("gpu-job", State.LAUNCHING, attempt=1)
    reg.put_json(keys.cluster("gpu-job", 1), ClusterFile(job_id="gpu-job", attempt=1, hosts=["10.1.1.1"],
                                                         master_addr="10.1.1.1", num_nodes=1,
                                                         idle_gpu=IdleWatch(window=window, threshold=5)).body())


def exists(reg: Registry, key: str) -> bool:
    try:
        reg.get_bytes(key)
        return True
    except NotFound:
        return False


def test_an_idle_rank_is_marked_with_its_heartbeats_and_an_idle_stop_is_reported_as_such(tmp_path: Path) -> None:
    reg = Registry(MemoryStore())
    seed(reg, window=0.6)
    readings = [0.0]  # what nvidia-smi would say: idle until the test says otherwise
    config = AgentConfig(ml_root=tmp_path / "ml", log_interval=0.2, heartbeat_interval=0.2, poll_interval=0.2,
                         checkpoint_interval=0.3, retry_pause=0.01)
    with FakeImds(ImdsInstance("i-gpu", tags={TAG_JOB_ID: "gpu-job", TAG_ATTEMPT: "1"})) as imds:
        agent = Agent(reg, Ec2Metadata(imds.url), config, environ=os.environ, power_off=lambda: None,
                      gpu_utilization=lambda: readings[0])
        done: list[int] = []
        runner = threading.Thread(target=lambda: done.append(agent.run()), daemon=True)
        runner.start()
        try:
            mark = keys.idle_mark("gpu-job", 1, 0)
            wait_for("the rank's idle mark", lambda: exists(reg, mark), 30)
            body = reg.get_json(mark)
            assert body["mean_gpu_util"] == 0.0 and body["window"] == 0.6 and body["threshold"] == 5
            assert reg.get_json(keys.heartbeat("gpu-job", 1, 0))["gpu_util"] == 0.0

            readings[0] = 80.0  # busy: the mark is no longer rewritten
            written = reg.store.get(reg.key(mark)).last_modified
            beat_key = reg.key(keys.heartbeat("gpu-job", 1, 0))
            wait_for("two heartbeats after the GPU got busy",
                     lambda: (reg.store.get(beat_key).last_modified - written).total_seconds() > 1.0, 30)
            assert reg.store.get(reg.key(mark)).last_modified == written

            reg.put_json(keys.stop_request("gpu-job"), StopRequest(time=datetime.now(UTC), by="idle-gpu",
                                                                   reason="GPU utilization under 5%").body())
            runner.join(30)
            assert done == [0]
        finally:
            runner.join(30)
    report = reg.get_json(keys.exit_report("gpu-job", 1, 0))
    assert report["reason"] == "stopped" and report["stopped_by"] == "idle-gpu"
    assert report["stop_reason"] == "GPU utilization under 5%"


def test_no_idle_policy_in_cluster_json_means_no_marks(tmp_path: Path) -> None:
    reg = Registry(MemoryStore())
    reg.create_job("cpu-job", JobSpec(instance_type="t3.micro", run="sleep 1"))
    reg.transition("cpu-job", State.LAUNCHING, attempt=1)
    reg.put_json(keys.cluster("cpu-job", 1), ClusterFile(job_id="cpu-job", attempt=1, hosts=["10.1.1.1"],
                                                         master_addr="10.1.1.1", num_nodes=1).body())
    config = AgentConfig(ml_root=tmp_path / "ml", log_interval=0.2, heartbeat_interval=0.2, poll_interval=0.2,
                         checkpoint_interval=0.3, retry_pause=0.01)
    with FakeImds(ImdsInstance("i-cpu", tags={TAG_JOB_ID: "cpu-job", TAG_ATTEMPT: "1"})) as imds:
        started = time.monotonic()
        assert Agent(reg, Ec2Metadata(imds.url), config, environ=os.environ, power_off=lambda: None,
                     gpu_utilization=lambda: 0.0).run() == 0
    assert time.monotonic() - started >= 1  # it ran for longer than a window would have been
    assert not [k for k, _, _ in reg.listing(keys.heartbeats_prefix("cpu-job")) if k.endswith(".idle")]
    assert "stopped_by" not in reg.get_json(keys.exit_report("cpu-job", 1, 0))
