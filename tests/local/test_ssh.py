"""`jobplane ssh` on the local cloud: a command in a running job's VM (inside its Debian 12 image, as one of its
processes), refused while the policy's access.ssh is off, and for a rank the job does not have; the same job's VM
after it failed, while its debug_hold lasts. A second local cloud started with ssh on (`local up --policy`) beside
this one is its own: its own moto and policy, and one on this cloud's port fails naming it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from jobplane.local import rootfs
from jobplane.local.demo import REPO, CloudProcess
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.policy import parse_policy
from jobplane.model.states import State
from tests.helpers import wait_for
from tests.local.conftest import ModuleCloud, cli_ok, policy_over, shell_code, submit, write_spec
from tests.warm import Warm

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(300)]
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): its checks read only its job
HOLD = 15  # seconds of debug_hold: the look below takes about 6 of them
ORPHAN_GRACE = 6  # the policy's, for this test (the local cloud's is 20 s): a hold proves it outlives the grace sooner
SWEEPS = 4  # seconds: a couple of the local cloud's sweeps (every 2 s)
# It prints now and then (a job silent for the local policy's 60 s stall_timeout is STALLED, which a slow look on a
# loaded machine reached), and fails once a command through ssh says so: one VM serves the running job's claims, then
# the failed job's (a VM fewer)
RUN = ("'echo ready; for i in $(seq 600); do [ -e /tmp/fail-now ] && { echo broke; exit 3; }; sleep 0.5; "
       "[ $((i % 10)) = 0 ] && echo alive; done'")


def test_ssh_enters_a_running_job_s_vm_when_the_policy_allows_it_and_a_failed_one_s_while_its_debug_hold_lasts(
        cloud: CloudProcess, tmp_path: Path) -> None:
    if problem := rootfs.image_problem():
        pytest.skip(problem)
    job_id = submit(cloud, write_spec(tmp_path, "held", RUN, spot="false", image="debian-12",
                                      debug_hold=f"{HOLD}s"), shell_code(tmp_path))
    reg = cloud.registry()
    wait_for("the job to run", lambda: reg.exists(job_id) and reg.job(job_id).state == State.RUNNING
             and "ready" in cloud.cli("logs", job_id).stdout, 120, every=1.0)
    try:
        off = cloud.cli("ssh", job_id, "--", "echo", "ok")
        assert off.returncode == 1 and "ssh is off in this deployment's policy" in off.stderr, off
        with policy_over(cloud, {"access": {"ssh": True}, "safety": {"orphan_grace": f"{ORPHAN_GRACE}s"}}):
            look = "echo ok; grep PRETTY_NAME /etc/os-release; echo $JOBPLANE_LOCAL_INSTANCE"
            on = cloud.cli("ssh", job_id, "--", look)
            # its stdout and nothing else; the VM's image, not this machine; one of the VM's processes (it ends with it)
            assert (on.returncode, on.stdout.splitlines()) == (0, [
                "ok", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"', reg.job(job_id).instances[0]]), on
            other = cloud.cli("ssh", job_id, "--rank", "1", "--", "true")
            assert other.returncode == 1 and "has ranks 0 to 0, not 1" in other.stderr
            code = cloud.cli("ssh", job_id, "--", "touch /tmp/fail-now; exit 7")  # the job's own /tmp: it exits 3
            assert code.returncode == 7, code
            held_look(cloud, job_id)
    finally:
        if not reg.job(job_id).terminal:
            cli_ok(cloud, "cancel", job_id)


def held_look(cloud: CloudProcess, job_id: str) -> None:
    """The failed job's VM (its agent did not power off) answers past the orphan grace and a few sweeps, until the
    sweeper ends the hold; then ssh says the VMs are gone, and the hold is billed."""
    reg = cloud.registry()
    wait_for("the job to fail", lambda: reg.job(job_id).state == State.FAILED, 120, every=0.5)
    failed = reg.job(job_id)
    assert failed.held_until is not None and "VMs held for debugging until" in (failed.reason or "")
    assert "held until" in cli_ok(cloud, "describe", job_id)
    (vm,) = failed.instances
    launched = next(i.launched_at for i in cloud.vms() if i.id == vm)
    # the orphan rule would end it from the later of these on (the VM past the grace, the job no longer live)
    exposed = max(launched + timedelta(seconds=ORPHAN_GRACE), failed.held_until - timedelta(seconds=HOLD))
    wait_for("a few sweeps past the orphan grace", lambda: (utcnow() - exposed).total_seconds() > SWEEPS, 60)
    assert any(i.id == vm for i in cloud.vms())
    assert cli_ok(cloud, "ssh", job_id, "--", "echo", "still here") == "still here\n"
    wait_for("the sweeper to end the hold", lambda: any(
        e["kind"] == "terminated" and e.get("rule") == "hold-over" for e in reg.events(job_id)), 120, every=1.0)
    gone = cloud.cli("ssh", job_id, "--", "true")
    assert gone.returncode == 1 and f"job {job_id} is FAILED: its VMs are gone" in gone.stderr
    ended = reg.job(job_id)
    assert not any(u.open for u in ended.usage) and ended.usage[0].instances[0].end is not None
    assert ended.usage[0].instances[0].end >= failed.held_until  # the hold is billed
def test_a_second_local_cloud_beside_is_its_own_and_one_on_a_busy_port_fails_naming_it(cloud: CloudProcess,
                                                                                      tmp_path: Path,
                                                                                      warm: Warm) -> None:
    """About 4 s: one more cloud up and down (a second `local up` on a busy port once used the first's moto as its
    own, overwrote its policy and ran its jobs' VMs a second time). Both `local up`s forked warm, as the module's."""
    reg = cloud.registry()
    policy = reg.get_bytes(keys.POLICY)
    port = int(cloud.state["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    busy = ModuleCloud(tmp_path / "busy", warm=warm, port=port)
    try:
        with pytest.raises(RuntimeError, match="local up exited 1"):
            busy.start()
    finally:
        busy.stop()
    said = (tmp_path / "busy" / "local-cloud.log").read_text()
    assert f"port {port} on 127.0.0.1 is in use (by another local cloud?)" in said and "--port 0" in said, said
    # beside it, with docs/local.md's policy file (ssh on)
    second = ModuleCloud(tmp_path / "second", warm=warm, policy=REPO / "examples" / "local" / "policy-ssh.yaml")
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
