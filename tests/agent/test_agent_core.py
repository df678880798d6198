"""The agent core in-process: failures of the registry, the cluster or the job never skip the exit report
or the power-off. The store is the real in-memory store, wrapped to fail writes the way a network does. What only
waits (for the instance's tags, for cluster.json, between retries) runs on a manual clock: nothing sleeps; what
runs a user process runs on the real one."""

from __future__ import annotations

import io
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobplane.agent import Agent, AgentConfig
from jobplane.agent.clock import SYSTEM, Clock
from jobplane.agent.core import HOLD_MARGIN_S, grace_within
from jobplane.agent.keeper import sync_budget
from jobplane.agent.run import AGENT_ERROR, Outcome, hold_for
from jobplane.clouds.aws_imds import Ec2Metadata
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID, CredentialsRefused
from jobplane.clouds.memory import MemoryStore
from jobplane.local.imds import FakeImds, ImdsInstance
from jobplane.local.waiting import wait_for
from jobplane.model import keys, sysmetrics
from jobplane.model.metrics import EARLY_STOP
from jobplane.model.records import HOLD_BY, ClusterFile, ExitReport
from jobplane.model.spec import JobSpec
from jobplane.model.states import State
from jobplane.store.registry import Registry
from tests.agent.clock import ManualClock
from tests.agent.conftest import FlakyStore
from tests.helpers import data_of

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds(ImdsInstance("i-core", tags={TAG_JOB_ID: "core-job", TAG_ATTEMPT: "1"})) as fake:
        yield fake


def make_agent(store: FlakyStore, imds: FakeImds, tmp_path: Path, powered: list[str], clock: Clock = SYSTEM,
               **overrides: float) -> Agent:
    config = AgentConfig(ml_root=tmp_path / "ml", log_interval=0.2, heartbeat_interval=0.2,
                         checkpoint_interval=0.3, poll_interval=0.2, retry_attempts=6, retry_pause=0.01,
                         **overrides)  # type: ignore[arg-type]
    return Agent(Registry(store), Ec2Metadata(imds.url), config, environ=os.environ,
                 power_off=lambda: powered.append("off"), clock=clock)


def seed(reg: Registry, run: str, *, attempt: int = 1, cluster: bool = True, debug_hold: int | None = None) -> None:
    reg.create_job("core-job", JobSpec(instance_type="t3.micro", run=run, debug_hold=debug_hold))
    reg.transition("core-job", State.LAUNCHING, attempt=attempt)
    if cluster:
        reg.put_json(keys.cluster("core-job", attempt), ClusterFile(job_id="core-job", attempt=attempt,
                                                                    hosts=["10.1.1.1"], master_addr="10.1.1.1",
                                                                    num_nodes=1).body())


def test_write_failures_are_retried_until_the_report_lands(imds: FakeImds, tmp_path: Path) -> None:
    store, powered = FlakyStore(), []
    reg = Registry(store)
    seed(reg, "for i in 1 2 3; do echo line $i; sleep 0.3; done; exit 7")
    store.failures = {"/exit.json": 3, "/logs/": 4, "heartbeats/": 2}
    assert make_agent(store, imds, tmp_path, powered).run() == 0
    assert reg.get_json(keys.exit_report("core-job", 1, 0))["code"] == 7
    data = data_of(reg, "core-job")
    logs = b"".join(reg.get_bytes(k) for k, _, _ in reg.listing(keys.logs_prefix(data, 1, 0))).decode()
    assert all(f"line {i}" in logs for i in (1, 2, 3))  # no chunk lost to a failed upload
    assert logs.index("line 1") < logs.index("line 2") < logs.index("line 3")
    assert store.failures == {"/exit.json": 0, "/logs/": 0, "heartbeats/": 0}
    assert reg.get_json(keys.heartbeat("core-job", 1, 0))["instance_id"] == "i-core"
    assert powered == ["off"]


def test_a_jobs_event_files_and_system_samples_are_in_the_bucket_by_its_end(imds: FakeImds, tmp_path: Path) -> None:
    store, powered = FlakyStore(), []
    reg = Registry(store)
    reg.create_job("core-job", JobSpec(instance_type="t3.micro", tensorboard={"log_dir": "/opt/ml/output/tensorboard"},
                                       run='mkdir -p "$JOBPLANE_TENSORBOARD_DIR/train" && '
                                           'echo records > "$JOBPLANE_TENSORBOARD_DIR/train/events.out.tfevents.1"'))
    reg.transition("core-job", State.LAUNCHING, attempt=1)
    reg.put_json(keys.cluster("core-job", 1), ClusterFile(job_id="core-job", attempt=1, hosts=["10.1.1.1"],
                                                          master_addr="10.1.1.1", num_nodes=1).body())
    assert make_agent(store, imds, tmp_path, powered).run() == 0
    event_file = keys.tensorboard_prefix(data_of(reg, "core-job"), 1, 0) + "train/events.out.tfevents.1"
    assert reg.get_bytes(event_file) == b"records\n"  # the job ended before a periodic upload: the final one
    data = data_of(reg, "core-job")
    (chunk,) = [k for k, _, _ in reg.listing(keys.system_prefix(data, 1, 0))]  # the first sample, at the end
    assert {"memory_used_gb", "disk_used_gb"} <= {s.name for s in sysmetrics.decode(reg.get_bytes(chunk), 1, 0)}


def test_a_registry_that_never_recovers_still_powers_off(imds: FakeImds, tmp_path: Path) -> None:
    store, powered = FlakyStore(), []
    seed(Registry(store), "echo hi")
    store.failures = {"jobs/": -1, "heartbeats/": -1, "teams/": -1}  # every write fails forever
    clock = ManualClock()  # every retry's pause passes at once
    assert make_agent(store, imds, tmp_path, powered, clock).run() == 1  # no report could be written
    assert powered == ["off"]
    # the heartbeat, logs, system metrics, artifacts and exit report each given up after six tries, 0.01 s to
    # 0.16 s apart; the artifacts manifest tried three times (0.5 s, 1 s apart) in each
    assert clock.waits.count(0.16) == 5 and clock.waits.count(1.0) == 6


def test_missing_cluster_is_an_agent_error_naming_the_key(imds: FakeImds, tmp_path: Path) -> None:
    store, powered = FlakyStore(), []
    reg = Registry(store)
    seed(reg, "echo never", cluster=False)
    clock = ManualClock()
    assert make_agent(store, imds, tmp_path, powered, clock, cluster_timeout=0.5).run() == 0
    assert clock.waits == [0.2, 0.2, 0.2]  # a look every poll interval, until past the timeout
    report = reg.get_json(keys.exit_report("core-job", 1, 0))
    assert report["code"] == 125 and report["reason"] == "exit"
    assert "attempts/1/cluster.json did not appear" in report["error"]
    assert powered == ["off"]


def test_a_node_of_an_older_attempt_stands_down(imds: FakeImds, tmp_path: Path) -> None:
    store, powered = FlakyStore(), []
    reg = Registry(store)
    seed(reg, "touch ran", attempt=2)  # the job moved on to attempt 2; this VM still says attempt 1
    assert make_agent(store, imds, tmp_path, powered).run() == 0
    report = ExitReport.parse(reg.get_bytes(keys.exit_report("core-job", 1, 0)))
    assert (report.reason, report.code, report.instance_id) == ("stopped", None, imds.instance.instance_id)
    assert not (tmp_path / "ml" / "code" / "ran").exists()
    assert powered == ["off"]


def test_without_job_tags_the_agent_powers_off_without_running(tmp_path: Path) -> None:
    store, powered = FlakyStore(), []
    clock = ManualClock()
    with FakeImds(ImdsInstance("i-untagged")) as bare:
        agent = make_agent(store, bare, tmp_path, powered, clock, identity_timeout=0.3)
        assert agent.run() == 2
    assert clock.waits == [0.2, 0.2]  # asked again every poll interval, until past the timeout
    assert powered == ["off"]
    assert list(store.list("")) == []


def test_intervals_above_the_contract_are_refused() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval must be > 0 and at most 30"):
        AgentConfig(heartbeat_interval=45)
    for freeze in (-1, 11):  # a frozen rank stalls its peers' collectives: never long
        with pytest.raises(ValueError, match=f"checkpoint_freeze must be between 0 and 10.0 s, got {freeze}"):
            AgentConfig(checkpoint_freeze=freeze)
    assert AgentConfig(checkpoint_freeze=0).checkpoint_freeze == 0  # never frozen


@pytest.mark.parametrize(("requested", "left", "grace"), [
    (60, None, 60),      # a stop request: no deadline, the spec's grace
    (60, 120, 60),       # EC2's two-minute notice has room for it
    (300, 120, 90),      # ... but keeps 30 s for the final sync
    (60, 30, 15),        # GCE's 30 s notice: half for the process, half for the sync
    (60, 25, 12.5),      # SIGTERM from the shutdown: the agent's 25 s budget
    (3, 25, 3),          # a short grace stays short
    (60, 6, 5),          # never under 5 s
    (60, -2, 5),         # even when the deadline has passed
])
def test_the_grace_fits_the_time_left(requested: float, left: float | None, grace: float) -> None:
    assert grace_within(requested, left) == grace


@pytest.mark.parametrize(("left", "budget"), [(120.0, 110.0), (40.0, 30.0), (10.0, 7.5), (2.0, 1.5), (-1.0, -1.0)])
def test_the_final_sync_keeps_a_reserve_for_the_exit_report_but_never_most_of_a_short_notice(
        left: float, budget: float) -> None:
    assert sync_budget(left) == budget


def test_a_stop_request_that_does_not_parse_still_stops_the_node(imds: FakeImds, tmp_path: Path) -> None:
    """Stopping is the safe reading of a request nobody can read; the report says why."""
    store, powered = FlakyStore(), []
    reg = Registry(store)
    seed(reg, "touch ran; sleep 60")
    store.put(keys.stop_request("core-job"), b'{"by": "cli"}')  # no time: written by nothing of ours
    assert make_agent(store, imds, tmp_path, powered).run() == 0
    report = ExitReport.parse(reg.get_bytes(keys.exit_report("core-job", 1, 0)))
    assert (report.reason, report.stopped_by) == ("stopped", "unknown")
    assert report.stop_reason == "stop request: field 'time': Field required"
    assert powered == ["off"]


class RevokedStore(MemoryStore):
    """Every call fails with CredentialsRefused once `revoked` is set, as after the vending function said no."""

    def __init__(self) -> None:
        super().__init__()
        self.revoked = threading.Event()
        self.refusals = 0

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name in {"get", "put", "put_if_absent", "put_if_match", "delete", "list", "upload_file"} \
                and super().__getattribute__("revoked").is_set():
            def refused(*args: Any, **kwargs: Any) -> Any:
                self.refusals += 1
                raise CredentialsRefused("attempt 1 of job core-job is over (the job is on attempt 2)")
            return refused
        return attr


def test_refused_credentials_stop_the_job_and_power_off_without_retrying(imds: FakeImds, tmp_path: Path) -> None:
    store, console = RevokedStore(), io.BytesIO()
    powered: list[str] = []
    reg = Registry(store)
    seed(reg, "echo started; sleep 60")
    config = AgentConfig(ml_root=tmp_path / "ml", log_interval=0.2, heartbeat_interval=0.2, checkpoint_interval=0.3,
                         poll_interval=0.2, retry_attempts=6, retry_pause=0.5)
    agent = Agent(reg, Ec2Metadata(imds.url), config, environ=os.environ, power_off=lambda: powered.append("off"),
                  console=console)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(agent.run()))
    runner.start()
    beat = keys.heartbeat("core-job", 1, 0)
    wait_for("the job's first output and heartbeat",
             lambda: b"started" in console.getvalue() and any(reg.listing(beat)), 15, 0.05)
    store.revoked.set()
    runner.join(20)
    assert result == [1] and powered == ["off"]  # no exit report could be written; the VM still goes away
    out = console.getvalue().decode()
    assert "storage credentials refused: attempt 1 of job core-job is over" in out
    assert "exit report impossible: the job's storage credentials were refused" in out
    assert store.refusals < 10  # each step tried once at most: no retry loop against a refusal


@pytest.mark.parametrize(("run", "held"), [("echo oops; exit 3", True), ("echo fine", False)])
def test_a_debug_hold_keeps_a_failed_node_up_for_the_hold_and_a_margin(imds: FakeImds, tmp_path: Path, run: str,
                                                                        held: bool) -> None:
    store, console = FlakyStore(), io.BytesIO()
    reg = Registry(store)
    seed(reg, run, debug_hold=1800)
    clock = ManualClock()  # the hold passes at once; the user process still runs in real time
    off: list[float] = []
    agent = Agent(reg, Ec2Metadata(imds.url), AgentConfig(ml_root=tmp_path / "ml", poll_interval=0.2),
                  environ=os.environ, power_off=lambda: off.append(clock.monotonic()), console=console, clock=clock)
    assert agent.run() == 0
    report = ExitReport.parse(reg.get_bytes(keys.exit_report("core-job", 1, 0)))
    assert report.code == (3 if held else 0)
    note = "debug_hold 30m: this VM stays up for `jobplane ssh core-job` until the hold ends"
    assert (note in console.getvalue().decode()) is held
    assert len(off) == 1
    # the manual clock moves with every tick of the agent's main thread while the process runs (a few minutes'
    # worth): far less than the hold, which the report went before (the sweeper holds the VM from it)
    assert (off[0] >= 1800 + HOLD_MARGIN_S) is held and off[0] < 1800 + HOLD_MARGIN_S + HOLD_MARGIN_S


def test_a_signal_ends_a_hold(imds: FakeImds, tmp_path: Path) -> None:
    clock = ManualClock()
    agent = make_agent(FlakyStore(), imds, tmp_path, [], clock)
    agent.on_signal(signal.SIGTERM)  # the VM is being terminated: the sweeper's end of the hold
    agent._hold(1800)
    assert clock.waits == []


@pytest.mark.parametrize(("outcome", "held"), [
    (Outcome(3, "exit"), True),
    (Outcome(AGENT_ERROR, "exit", error="could not fetch the code"), True),
    (Outcome(None, EARLY_STOP, error="loss is nan"), True),
    (Outcome(None, "stopped", stopped_by=HOLD_BY), True),  # a peer failed: the sweeper holds this VM too
    (Outcome(0, "exit"), False),
    (Outcome(None, "stopped", stopped_by="cli"), False),  # a cancel
    (Outcome(None, "stopped", stopped_by="uptime-cap"), False),
    (Outcome(143, "preempted"), False),  # the cloud takes the VM anyway
])
def test_which_ends_a_debug_hold_keeps_the_vm_up_for(outcome: Outcome, held: bool) -> None:
    spec = JobSpec(instance_type="t3.micro", run="python3 train.py", debug_hold="30m")
    assert hold_for(spec, outcome) == (1800 if held else 0)
    assert hold_for(spec.model_copy(update={"debug_hold": None}), outcome) == 0
