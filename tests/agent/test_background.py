"""The agent's background loop (agent/background.py) driven step by step on a manual clock, over an in-memory
registry: when each of its three jobs runs, what it writes, what a failed write costs, and what it hands to the
core. The contract's intervals (poll 5 s, logs 10 s, heartbeat 30 s) cost nothing here: nothing sleeps."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from jobplane.agent import background as background_module
from jobplane.agent.background import MIN_WAIT
from jobplane.agent.run import Outcome
from jobplane.clouds.base import CredentialsRefused
from jobplane.model import keys, metrics
from jobplane.model.records import Heartbeat, OutputMark, StopRequest
from tests.agent.conftest import LOOP_DATA, Loop, make_loop

pytestmark = pytest.mark.timeout(5)

NOTICE = {"action": "terminate", "time": "2026-11-22T12:02:00Z"}
BEAT = keys.heartbeat("loop-job", 1, 0)


def schedule(until: int, every: dict[str, int]) -> list[tuple[float, str]]:
    return [(float(t), name) for t in range(until + 1) for name in ("poll", "logs", "beat") if t % every[name] == 0]


def test_each_runs_when_due_and_the_loop_waits_exactly_until_the_next(loop: Loop) -> None:
    stop = threading.Event()
    loop.md.on_ask = lambda: stop.set() if loop.clock.monotonic() >= 60 else None
    loop.background.run(stop)  # in this thread: its waits move the clock
    assert loop.background.trace == schedule(60, {"poll": 5, "logs": 10, "beat": 30})
    assert loop.clock.waits == [5.0] * 12  # from one due time to the next, never a look in between
    assert stop.is_set()


def test_each_is_next_due_its_interval_after_it_returned(loop: Loop) -> None:
    def slow_nvidia_smi() -> float:
        loop.clock.advance(2)
        return 10.0

    loop.background.gpu_utilization = slow_nvidia_smi  # the heartbeat takes 2 s
    assert loop.background.step() == 3.0  # the next poll, at 5
    assert loop.background.due == {"poll": 5.0, "logs": 10.0, "beat": 32.0}


def test_the_loop_never_waits_less_than_min_wait() -> None:
    loop = make_loop(beat=30)
    stop = threading.Event()

    def slower_than_a_poll_interval() -> float:
        loop.clock.advance(7)
        return 10.0

    loop.background.gpu_utilization = slower_than_a_poll_interval
    loop.md.on_ask = lambda: stop.set() if len(loop.md.asked) == 2 else None
    loop.background.run(stop)
    assert loop.clock.waits == [MIN_WAIT]  # the poll was overdue when the heartbeat returned, at 7
    assert loop.md.asked == [0.0, 7 + MIN_WAIT]


def test_a_failed_write_is_logged_and_tried_again_when_next_due_while_the_others_go_on(
        loop: Loop, caplog: pytest.LogCaptureFixture) -> None:
    loop.store.failures = {"heartbeats/": 1}
    loop.out.user(b"step 1\n")
    with caplog.at_level(logging.WARNING, "jobplane.agent"):
        loop.until(29)
    assert "background beat failed: injected: connection reset" in caplog.text
    assert loop.md.asked == [0, 5, 10, 15, 20, 25]  # the poll went on
    assert loop.chunks() == [b"step 1\n"]  # and the logs
    assert not list(loop.reg.listing(BEAT))
    assert loop.store.failures == {"heartbeats/": 0}
    loop.until(30)
    assert Heartbeat.parse(loop.reg.get_bytes(BEAT)).time == loop.clock()  # at 30, not before
    assert loop.written_at(BEAT) == 30


def test_refused_credentials_go_to_the_core_and_the_loop_goes_on(loop: Loop) -> None:
    refusal = CredentialsRefused("attempt 1 of job loop-job is over")
    loop.store.failures, loop.store.error = {"heartbeats/": -1}, refusal
    loop.until(10)
    assert loop.refused == [refusal]  # once per heartbeat tried: one so far
    assert loop.md.asked == [0, 5, 10]
    assert loop.background.due["beat"] == 30


# ---- log and metrics chunks ------------------------------------------------------------------------------------
def test_log_chunks_keep_the_output_in_order_and_a_failed_upload_loses_nothing(loop: Loop) -> None:
    loop.out.user(b"line 1\n")
    loop.until(0)
    assert loop.chunks() == [b"line 1\n"]
    loop.store.failures = {"/logs/": 1}
    loop.out.user(b"line 2\n")
    loop.until(10)  # this flush fails: line 2 goes back ahead of what comes next
    assert loop.chunks() == [b"line 1\n"] and loop.background.seq["logs"] == 1
    loop.out.user(b"line 3\n")
    loop.until(20)
    assert loop.chunks() == [b"line 1\n", b"line 2\nline 3\n"]
    assert loop.background.seq == {"logs": 2, "metrics": 0}


def test_a_restarted_agent_writes_after_the_chunks_already_there(loop: Loop) -> None:
    """Chunks are create-only: an earlier agent of this node left 0 and 1, which stay as they are."""
    for seq in (0, 1):
        loop.reg.put(keys.log_chunk(LOOP_DATA, 1, 0, seq), f"earlier {seq}\n".encode())
    loop.out.user(b"after the restart\n")
    loop.background.ship_logs()
    assert loop.chunks() == [b"earlier 0\n", b"earlier 1\n", b"after the restart\n"]
    assert loop.background.seq["logs"] == 3


def test_output_and_metric_points_go_in_chunks_of_at_most_max_chunk(loop: Loop, monkeypatch: pytest.MonkeyPatch) \
        -> None:
    monkeypatch.setattr(background_module, "MAX_CHUNK", 100)
    loop.out.watch(metrics.Extractor(), lambda why: None)
    lines = [f"step {i} loss {1 / i:.4f}\n".encode() for i in range(1, 21)]
    for line in lines:
        loop.out.user(line)
    loop.store.failures = {"/metrics/": 1}  # the first metrics chunk fails: every point goes back
    with pytest.raises(OSError):
        loop.background.ship_logs()
    loop.background.ship_logs()
    logs, points = loop.chunks("logs"), loop.chunks("metrics")
    assert b"".join(logs) == b"".join(lines) and all(len(chunk) <= 100 for chunk in logs)
    assert all(len(chunk) <= 100 and chunk.endswith(b"\n") for chunk in points)  # whole lines only
    read = [json.loads(line) for chunk in points for line in chunk.splitlines()]
    assert [(p["metric"], p["step"]) for p in read] == [(m, i) for i in range(1, 21) for m in ("step", "loss")]


# ---- the poll: a Spot notice or a stop request -----------------------------------------------------------------
def test_a_spot_notice_interrupts_the_run_and_is_not_asked_for_again(loop: Loop) -> None:
    loop.until(5)
    loop.md.notice = NOTICE
    loop.until(10)
    assert loop.interrupts == [Outcome(None, "preempted", notice=NOTICE)]
    assert f"preempted: {NOTICE}" in b"".join(loop.chunks()).decode()  # in the log at once
    loop.until(60)
    assert loop.md.asked == [0, 5, 10]  # the core has its reason to stop: no more polls


def test_a_stop_request_interrupts_the_run_saying_who_asked_and_why(loop: Loop) -> None:
    loop.reg.put_json(keys.stop_request("loop-job"), StopRequest(time=loop.clock(), by="idle-gpu",
                                                                 reason="GPU utilization under 5%").body())
    loop.until(0)
    assert loop.interrupts == [Outcome(None, "stopped", stopped_by="idle-gpu", stop_reason="GPU utilization under 5%")]
    assert "stopped: stop requested by idle-gpu" in b"".join(loop.chunks()).decode()


def test_a_notice_comes_before_a_stop_request(loop: Loop) -> None:
    loop.md.notice = NOTICE
    loop.reg.put_json(keys.stop_request("loop-job"), StopRequest(time=loop.clock(), by="cli").body())
    loop.until(0)
    assert loop.interrupts == [Outcome(None, "preempted", notice=NOTICE)]


def test_a_stop_request_that_does_not_parse_still_stops_the_node_anonymously(loop: Loop) -> None:
    loop.reg.put(keys.stop_request("loop-job"), b'{"by": "cli"}')  # no time: written by nothing of ours
    loop.until(0)
    assert loop.interrupts == [Outcome(None, "stopped", stopped_by="unknown",
                                       stop_reason="stop request: field 'time': Field required")]
    assert "stopped: stop requested by unknown" in b"".join(loop.chunks()).decode()


def test_no_poll_once_the_core_has_another_reason_to_stop(loop: Loop) -> None:
    loop.background.interrupted = lambda: True  # a signal, or a stop_on match
    loop.md.notice = NOTICE
    loop.until(30)
    assert loop.md.asked == [] and loop.interrupts == []


# ---- heartbeats and the output mark ----------------------------------------------------------------------------
def test_a_heartbeat_says_the_phase_the_last_output_its_step_and_the_gpu(loop: Loop) -> None:
    loop.gpu[0] = 42.0
    loop.until(0)
    assert Heartbeat.parse(loop.reg.get_bytes(BEAT)) == Heartbeat(
        time=loop.clock(), instance_id="i-loop", rank=0, attempt=1, phase="running", gpu_util=42.0)
    loop.clock.advance(3)
    printed = loop.clock()
    loop.out.user(b"step 7 loss 0.1\n")
    loop.run.phase = "setup"
    loop.until(30)
    assert Heartbeat.parse(loop.reg.get_bytes(BEAT)) == Heartbeat(
        time=loop.clock(), instance_id="i-loop", rank=0, attempt=1, phase="setup", last_output_at=printed,
        gpu_util=42.0, step=7)


def test_the_output_mark_is_rewritten_only_when_there_is_new_output(loop: Loop) -> None:
    mark = keys.output_mark("loop-job", 1, 0)
    loop.until(29)
    assert [k for k, _, _ in loop.reg.listing(keys.heartbeats_prefix("loop-job"))] == [BEAT]  # no output yet
    loop.clock.advance(1)
    loop.out.user(b"step 3\n")
    loop.until(30)
    assert OutputMark.parse(loop.reg.get_bytes(mark)) == OutputMark(time=loop.clock(), step=3)
    loop.until(90)  # two more heartbeats, nothing printed
    assert loop.written_at(mark) == 30 and loop.written_at(BEAT) == 90
    loop.out.user(b"step 4\n")
    loop.until(120)
    assert loop.written_at(mark) == 120 and OutputMark.parse(loop.reg.get_bytes(mark)).step == 4
