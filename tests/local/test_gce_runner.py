"""The local cloud's GCE instance runner does what GCE does to a VM, with real processes: VMs launched through
the real adapter (google-cloud-compute against the Compute fake) boot their startup-script; a preemption runs
the VM's real shutdown-script, whose pgrep sees only that VM's processes, then deletes the VM after the grace
and records the preemption; maxRunDuration does the same at its deadline; a guest power-off leaves the VM
TERMINATED; the serial console is what the VM printed; an address off loopback is refused."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobplane.agent.process import marked_pids
from jobplane.clouds.base import LaunchRequest
from jobplane.clouds.gcp import GceCompute
from jobplane.local import fake_compute
from jobplane.local.fake_compute import FakeComputeServer
from jobplane.local.gce_runner import GceRunner
from jobplane.local.loopback import on_loopback
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(120)
PROJECT, REGION = "runner-test", "us-central1"
# What the shutdown-script's pgrep looks for (jobplane.clouds.gcp.AGENT_MATCH), without a real agent.
AGENT = 'echo "booted $HOSTNAME"; exec -a "python3 -m jobplane.agent" sleep 600\n'


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeComputeServer]:
    with FakeComputeServer(PROJECT, op_polls=0, consoles=tmp_path / "instances") as server:
        yield server


@pytest.fixture
def gce(fake: FakeComputeServer) -> GceCompute:
    return GceCompute(PROJECT, REGION, endpoint=fake.endpoint, operation_timeout=30)


@pytest.fixture
def events() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def runner(fake: FakeComputeServer, tmp_path: Path, events: list[tuple[str, str]]) -> Iterator[GceRunner]:
    # a cloud id of its own: stop_all() ends every process carrying it, and nothing of another test may
    runner = GceRunner(fake, tmp_path, {"PATH": "/usr/bin:/bin"}, f"gce-runner-test-{secrets.token_hex(4)}",
                       lambda what, iid, detail: events.append((what, iid)), shutdown_budget=20)
    try:
        yield runner
    finally:
        runner.stop_all()


def launch(gce: GceCompute, job_id: str, script: str = AGENT, max_runtime: int = 600) -> str:
    request = LaunchRequest(job_id=job_id, attempt=1, num_nodes=1, instance_type="e2-small", zone="us-central1-a",
                            image="projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64", spot=True,
                            user_data="#!/bin/bash\n" + script, max_runtime=max_runtime, disk_gb=10, owner="me")
    (vm,) = gce.launch(request)
    return vm.id


def agent_running(iid: str) -> bool:
    return any("jobplane.agent" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
               for pid in marked_pids(f"JOBPLANE_LOCAL_INSTANCE={iid}") if Path(f"/proc/{pid}").exists())


def settle(runner: GceRunner, what: str, check: Callable[[], object], timeout: float = 60) -> None:
    """Tick the runner until check() holds."""
    def ticked() -> bool:
        runner.sync()
        return bool(check())
    wait_for(what, ticked, timeout, every=0.2)


def test_a_preemption_runs_only_that_vms_shutdown_script_then_deletes_it_after_the_grace(
        gce: GceCompute, fake: FakeComputeServer, runner: GceRunner, events: list[tuple[str, str]]) -> None:
    bystander = launch(gce, "bystander")
    settle(runner, "the bystander's fake agent", lambda: agent_running(bystander))
    spot = launch(gce, "spot")  # younger: an unscoped `pgrep -o` would pick the bystander's agent
    settle(runner, "the spot VM's fake agent", lambda: agent_running(spot))
    assert all(on_loopback(vm["networkInterfaces"][0]["networkIP"]) for vm in fake.instances())

    (hit,) = runner.preempt("spot", None, grace=3)
    assert hit["instance_id"] == spot and runner.nodes[spot].metadata.base_url  # its metadata server still up
    settle(runner, "the shutdown-script's SIGTERM to the spot VM's agent", lambda: not agent_running(spot), 30)
    assert agent_running(bystander), "the shutdown-script's pgrep reached another VM's agent"
    assert fake.status(spot) == "RUNNING"  # GCE waits out the grace before it deletes the VM
    settle(runner, "the VM deleted after the grace", lambda: fake.status(spot) is None, 30)
    assert [p.instance_id for p in gce.preempted()] == [spot]
    assert ("preempted", spot) in events and ("deleted", spot) in events
    assert fake.status(bystander) == "RUNNING" and agent_running(bystander)


def test_max_run_duration_is_gces_own_uptime_cap(gce: GceCompute, fake: FakeComputeServer, runner: GceRunner,
                                                 events: list[tuple[str, str]]) -> None:
    capped, other = launch(gce, "capped", max_runtime=3), launch(gce, "long")
    settle(runner, "the fake agents", lambda: agent_running(capped) and agent_running(other))
    # the shutdown-script ends with the agent, well inside its budget (20 s): the runner reaps the agent as init
    # would, where a zombie would answer the script's `kill -0` until the budget ran out
    settle(runner, "the VM deleted at its maxRunDuration, inside the shutdown-script's budget",
           lambda: fake.status(capped) is None, 15)
    assert events.index(("capped", capped)) < events.index(("deleted", capped))
    assert not marked_pids(f"JOBPLANE_LOCAL_INSTANCE={capped}")
    node, vm = runner.nodes.get(other), runner.vms.get(other)
    assert agent_running(other), (f"the uncapped VM's agent is gone: events {events}, its ending "
                                  f"{vm.ending if vm else 'forgotten'}, status {fake.status(other)}, "
                                  f"notes {node.notes if node else None}")
    assert gce.preempted() == []


def test_a_guest_power_off_leaves_the_vm_terminated_and_the_console_says_what_it_printed(
        gce: GceCompute, fake: FakeComputeServer, runner: GceRunner, events: list[tuple[str, str]]) -> None:
    vm = launch(gce, "done", script='echo "training done"; shutdown -h now\n')
    settle(runner, "the VM stopped by its guest", lambda: fake.status(vm) == "TERMINATED")
    assert ("stopped", vm) in events and not marked_pids(f"JOBPLANE_LOCAL_INSTANCE={vm}")
    assert "training done" in gce.console_output(vm)
    gce.terminate([vm])
    assert fake.status(vm) is None


def test_a_vm_off_loopback_is_refused_and_deleted(gce: GceCompute, fake: FakeComputeServer, runner: GceRunner,
                                                  monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fake_compute, "LOOPBACK_SUBNET", ipaddress.ip_network("10.20.0.0/16"))
    vm = launch(gce, "off", script=f"touch {tmp_path}/it-ran\n")
    runner.sync()
    assert vm in runner.done and fake.status(vm) is None and not (tmp_path / "it-ran").exists()
