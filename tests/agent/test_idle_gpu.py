"""The agent's side of idle GPUs: a rank's mean GPU utilization over the window cluster.json gives, written as
its `.idle` mark with each heartbeat while it is under the threshold; and a stop request's author copied into
the exit report, so the sweeper can tell an idle-GPU stop from the uptime cap's. The background loop runs on a
manual clock (tests/agent/conftest.py: Loop), with the contract's 30 s heartbeat and a two-minute window."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobplane.agent.core import exit_report
from jobplane.agent.idle import IdleMeter
from jobplane.agent.layout import Cluster
from jobplane.agent.run import Outcome
from jobplane.model import keys
from jobplane.model.records import ClusterFile, Heartbeat, IdleMark, IdleWatch, StopRequest
from tests.agent.conftest import Loop, make_loop

pytestmark = pytest.mark.timeout(5)
MARK, BEAT = keys.idle_mark("loop-job", 1, 0), keys.heartbeat("loop-job", 1, 0)


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


def cluster(idle: IdleWatch | None) -> Cluster:
    return Cluster.parse(ClusterFile(job_id="loop-job", attempt=1, hosts=["10.1.1.1"], master_addr="10.1.1.1",
                                     num_nodes=1, idle_gpu=idle).model_dump_json(), 0)


def watching(window: float, threshold: float = 5) -> Loop:
    """A node whose cluster.json watches idle GPUs, its GPU idle (0 %) until the test says otherwise."""
    loop = make_loop()
    watch = cluster(IdleWatch(window=window, threshold=threshold))
    loop.background.idle = IdleMeter.watching(watch.idle_window, watch.idle_threshold)
    loop.gpu[0] = 0.0
    return loop


def test_an_idle_rank_is_marked_with_its_heartbeats_until_its_gpu_is_busy() -> None:
    loop = watching(window=120)
    loop.until(90)  # heartbeats at 0, 30, 60, 90: the readings do not cover the window yet
    assert not list(loop.reg.listing(MARK))
    loop.until(120)
    assert IdleMark.parse(loop.reg.get_bytes(MARK)) == IdleMark(time=loop.clock(), mean_gpu_util=0.0, window=120,
                                                                threshold=5)
    assert Heartbeat.parse(loop.reg.get_bytes(BEAT)).gpu_util == 0.0
    assert loop.written_at(MARK) == loop.written_at(BEAT) == 120  # with the heartbeat, never before it

    loop.gpu[0] = 80.0  # busy: the mark is no longer rewritten, while the heartbeats go on
    loop.until(180)
    assert loop.written_at(BEAT) == 180 and loop.written_at(MARK) == 120
    assert Heartbeat.parse(loop.reg.get_bytes(BEAT)).gpu_util == 80.0


def test_only_the_run_phase_counts_and_a_phase_change_starts_the_window_over() -> None:
    loop = watching(window=120)
    loop.run.phase = "setup"  # setup and installs are expected to leave GPUs idle
    loop.until(150)  # six heartbeats in setup, the last at 150
    assert not list(loop.reg.listing(MARK))
    loop.run.phase = "running"
    loop.until(270)  # the first reading that counts was at 180: a window of them ends at 300
    assert not list(loop.reg.listing(MARK))
    loop.until(300)
    assert loop.written_at(MARK) == 300


def test_no_idle_watch_in_cluster_json_means_no_meter_and_no_marks() -> None:
    plain = cluster(None)
    assert IdleMeter.watching(plain.idle_window, plain.idle_threshold) is None
    loop = make_loop()
    loop.gpu[0] = 0.0
    loop.until(3600)  # an hour of idle GPU: far longer than any window
    assert [k for k, _, _ in loop.reg.listing(keys.heartbeats_prefix("loop-job"))] == [BEAT]
    assert Heartbeat.parse(loop.reg.get_bytes(BEAT)).gpu_util == 0.0


def test_an_idle_gpu_stop_is_reported_as_such() -> None:
    loop = watching(window=120)
    loop.until(120)
    loop.clock.advance(1)
    loop.reg.put_json(keys.stop_request("loop-job"), StopRequest(time=loop.clock(), by="idle-gpu",
                                                                 reason="GPU utilization under 5%").body())
    loop.until(125)  # the next poll
    [stopped] = loop.interrupts
    stopped.code = 137
    report = exit_report(loop.run, stopped, loop.clock())
    assert (report.reason, report.stopped_by, report.stop_reason) == ("stopped", "idle-gpu", "GPU utilization under 5%")
    assert report.ended_at - report.started_at == timedelta(seconds=125)


def test_an_exit_report_names_who_stopped_the_node_only_when_it_was_stopped(loop: Loop) -> None:
    ran = exit_report(loop.run, Outcome(0, "exit", stopped_by="idle-gpu", stop_reason="late"), loop.clock())
    assert "stopped_by" not in ran.body() and "stop_reason" not in ran.body()
    anonymous = exit_report(loop.run, Outcome(None, "stopped", stop_reason="why"), loop.clock())
    assert "stop_reason" not in anonymous.body()  # a reason only with the one who gave it
