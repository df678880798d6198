"""`jobplane ssh` on the local cloud: a command in a running job's VM (inside its Debian 12 image, as one of its
processes), refused while the policy's access.ssh is off, and for a rank the job does not have; a failed job's VM
while its debug_hold lasts. A second local cloud started with ssh on (`local up --policy`) beside this one is its
own: its own moto and policy, and one on this cloud's port fails naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobplane.local import rootfs
from jobplane.local.demo import REPO, CloudProcess
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.policy import parse_policy
from jobplane.model.states import State
from tests.helpers import wait_for
from tests.local.conftest import cli_ok, policy_over, shell_code, submit, write_spec

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(300)]


@pytest.fixture
def ssh_on(cloud: CloudProcess) -> Iterator[None]:
    with policy_over(cloud, {"access": {"ssh": True}}):
        yield


@pytest.fixture
def ssh_on_short_orphan_grace(cloud: CloudProcess) -> Iterator[None]:
    """ssh on, and an orphan grace of 6 s (the local cloud's is 20 s): a hold proves it outlives the grace sooner."""
    with policy_over(cloud, {"access": {"ssh": True}, "safety": {"orphan_grace": "6s"}}):
        yield


def test_ssh_runs_a_command_in_the_jobs_vm_only_when_the_policy_allows_it(cloud: CloudProcess, tmp_path: Path,
                                                                        request: pytest.FixtureRequest) -> None:
    if problem := rootfs.image_problem():
        pytest.skip(problem)
    # it prints now and then: a job silent for the local policy's 60 s stall_timeout is STALLED, which a slow look
    # on a loaded machine reached
    job_id = submit(cloud, write_spec(tmp_path, "held", "echo ready; for i in $(seq 60); do sleep 5; echo alive; done",
                                      spot="false", image="debian-12"), shell_code(tmp_path))
    reg = cloud.registry()
    wait_for("the job to run", lambda: reg.exists(job_id) and reg.job(job_id).state == State.RUNNING
             and "ready" in cloud.cli("logs", job_id).stdout, 120, every=1.0)
    try:
        off = cloud.cli("ssh", job_id, "--", "echo", "ok")
        assert off.returncode == 1 and "ssh is off in this deployment's policy" in off.stderr, off
        request.getfixturevalue("ssh_on")
        on = cloud.cli("ssh", job_id, "--", "echo", "ok")
        assert (on.returncode, on.stdout) == (0, "ok\n"), on.stderr
        inside = cli_ok(cloud, "ssh", job_id, "--", "grep PRETTY_NAME /etc/os-release; echo $JOBPLANE_LOCAL_INSTANCE")
        assert 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"' in inside  # the VM's image, not this machine
        assert reg.job(job_id).instances[0] in inside  # one of the VM's processes: it ends with the VM
        code = cloud.cli("ssh", job_id, "--", "exit", "7")
        assert code.returncode == 7
        other = cloud.cli("ssh", job_id, "--rank", "1", "--", "true")
        assert other.returncode == 1 and "has ranks 0 to 0, not 1" in other.stderr
    finally:
        cli_ok(cloud, "cancel", job_id)


def test_a_failed_job_s_debug_hold_keeps_its_vm_for_a_look_then_the_sweeper_ends_it(cloud: CloudProcess,
                                                                                    tmp_path: Path,
                                                                                    ssh_on_short_orphan_grace: None
                                                                                    ) -> None:
    if problem := rootfs.image_problem():
        pytest.skip(problem)
    job_id = submit(cloud, write_spec(tmp_path, "broke", "echo broke; exit 3", spot="false", image="debian-12",
                                      debug_hold="25s"), shell_code(tmp_path))
    reg = cloud.registry()
    wait_for("the job to fail", lambda: reg.exists(job_id) and reg.job(job_id).state == State.FAILED, 120, every=0.5)
    failed = reg.job(job_id)
    assert failed.held_until is not None and "VMs held for debugging until" in (failed.reason or "")
    assert "held until" in cli_ok(cloud, "describe", job_id)
    (vm,) = failed.instances
    # past the policy's 6 s orphan grace and a few sweeps, the VM (its agent did not power off) still answers
    wait_for("the VM to be older than the orphan grace", lambda: any(
        i.id == vm and (utcnow() - i.launched_at).total_seconds() > 10 for i in cloud.vms()), 60)
    assert cli_ok(cloud, "ssh", job_id, "--", "echo", "still here") == "still here\n"
    wait_for("the sweeper to end the hold", lambda: any(
        e["kind"] == "terminated" and e.get("rule") == "hold-over" for e in reg.events(job_id)), 120, every=1.0)
    gone = cloud.cli("ssh", job_id, "--", "true")
    assert gone.returncode == 1 and f"job {job_id} is FAILED: its VMs are gone" in gone.stderr
    ended = reg.job(job_id)
    assert not any(u.open for u in ended.usage) and ended.usage[0].instances[0].end is not None
    assert ended.usage[0].instances[0].end >= failed.held_until  # the hold is billed


def test_a_second_local_cloud_beside_is_its_own_and_one_on_a_busy_port_fails_naming_it(cloud: CloudProcess,
                                                                                      tmp_path: Path) -> None:
    """About 4 s: one more cloud up and down (a second `local up` on a busy port once used the first's moto as its
    own, overwrote its policy and ran its jobs' VMs a second time)."""
    reg = cloud.registry()
    policy = reg.get_bytes(keys.POLICY)
    port = int(cloud.state["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    busy = CloudProcess(tmp_path / "busy", port=port)
    try:
        with pytest.raises(RuntimeError, match="local up exited 1"):
            busy.start()
    finally:
        busy.stop()
    said = (tmp_path / "busy" / "local-cloud.log").read_text()
    assert f"port {port} on 127.0.0.1 is in use (by another local cloud?)" in said and "--port 0" in said, said
    # beside it, with docs/local.md's policy file (ssh on)
    second = CloudProcess(tmp_path / "second", policy=REPO / "examples" / "local" / "policy-ssh.yaml")
    try:
        second.start()
        assert second.state["AWS_ENDPOINT_URL"] != cloud.state["AWS_ENDPOINT_URL"]
        assert second.state["services"]["moto"] != cloud.state["services"]["moto"]
        assert parse_policy(second.registry().get_bytes(keys.POLICY)).access.ssh
        second.registry().put("second-only", b"x")
        assert not reg.has("second-only")
    finally:
        second.stop()
        assert not second.leftovers()
    assert reg.get_bytes(keys.POLICY) == policy and not parse_policy(policy).access.ssh
