"""The reconcilers' scenarios on the GCP adapters: registry on GCS (the precondition-enforcing fake),
VMs on the Compute fake through the real google-cloud-compute client, unchanged launcher and reconcile code.

How the VM side is driven, per test:
- test_spot_preemption_then_resume_with_the_real_agent runs the real agent (`python3 -m jobplane.agent
  --cloud gcp`) as a subprocess per VM, against fake GCS and the VM's fake metadata server, with
  power-off shimmed: the notice comes from instance/preempted, the job resumes from its checkpoint.
- every other test writes the agent's facts (heartbeats, output marks, exit reports, preempted-jobs/
  markers) into the registry itself, and moves time by passing a later `now`, as a later cron run sees it.
Drops go through the launcher function (CloudEvent, functions-framework test client); scheduled runs go
through the HTTP functions where wall-clock time suffices, else through the reconcile calls they make.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from functions_framework import create_app

from jobplane.clouds.gcp import deployment_label, deployment_prefix, shutdown_script
from jobplane.control import launcher, reconcile
from jobplane.decide.model import Rule
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import keys, records
from jobplane.model.clock import utcnow
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import State
from tests.gcp.conftest import BUCKET, DEPLOYMENT, PROJECT, REGION, GcpCloud
from tests.gcp.helpers import MAIN, SPEC, beat, call, exit_report, finalized
from tests.helpers import data_of, run_bootstrap, wait_for
from tests.local.conftest import paced

T = TypeVar("T")
pytestmark = [pytest.mark.scenario, pytest.mark.timeout(180)]
REPO = Path(__file__).parents[2]
OURS = deployment_prefix(DEPLOYMENT)  # the start of every VM name of the deployment under test


def later(minutes: float) -> datetime:
    return utcnow() + timedelta(minutes=minutes)


def submit(cloud: GcpCloud, job_id: str, spec: str = SPEC) -> JobRecord:
    """Drop the spec into queue/ and deliver the bucket's finalized event to the launcher function."""
    key = keys.queue_entry(job_id)
    cloud.registry.store.put(cloud.registry.key(key), spec.encode(), "application/yaml")
    response = create_app("launcher", MAIN, "cloudevent").test_client().post("/", **finalized("reg/" + key))
    assert response.status_code == 200
    return cloud.registry.job(job_id)


def vm_names(cloud: GcpCloud) -> list[str]:
    return sorted(v["name"] for v in cloud.compute_fake.instances())


def test_success_then_the_sweeper_finishes_and_deletes(cloud: GcpCloud) -> None:
    record = submit(cloud, "ok-job")
    assert record.state == State.LAUNCHING and vm_names(cloud) == [f"{OURS}ok-job-a1-0001"]
    beat(cloud, record)
    assert [a["rule"] for a in call("sweeper")["actions"]] == [Rule.STARTED]
    assert cloud.registry.job("ok-job").state == State.RUNNING
    exit_report(cloud, record, 0)
    assert [(a["rule"], a["result"]) for a in call("sweeper")["actions"]] == [(Rule.FINISHED, "applied")]
    final = cloud.registry.job("ok-job")
    assert final.state == State.SUCCEEDED and final.exit_code == 0 and cloud.registry.active() == {}
    assert_vms_deleted(cloud)


def assert_vms_deleted(cloud: GcpCloud) -> None:
    """A powered-off GCE VM stays TERMINATED (its disk still billed), unlike EC2's terminate-on-shutdown:
    the check that finishes the job deletes it with the rest."""
    assert vm_names(cloud) == []


def test_failure_records_the_exit_code(cloud: GcpCloud) -> None:
    record = submit(cloud, "bad-code", SPEC + "num_nodes: 2\n")
    beat(cloud, record)
    call("sweeper")
    exit_report(cloud, record, 0, rank=0)
    exit_report(cloud, record, 3, rank=1)
    call("sweeper")
    final = cloud.registry.job("bad-code")
    assert final.state == State.FAILED and final.exit_code == 3
    assert_vms_deleted(cloud)


def together(clients: list[Any], call: Callable[[Any], T]) -> list[T]:
    """call(client) for each client, each from its own thread, released together. Make the apps before (one at
    a time): CPython 3.11 can fail compiling in several threads at once ("AST constructor recursion depth
    mismatch"), and a thread that died before the barrier would stall the others."""
    barrier, results = threading.Barrier(len(clients)), list[T]()

    def run(client: Any) -> None:
        barrier.wait(60)
        results.append(call(client))

    threads = [threading.Thread(target=run, args=(client,)) for client in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_duplicate_events_launch_once(cloud: GcpCloud) -> None:
    key = keys.queue_entry("dup-job")
    cloud.registry.store.put(cloud.registry.key(key), SPEC.encode(), "application/yaml")
    launchers = [create_app("launcher", MAIN, "cloudevent").test_client() for _ in range(10)]
    codes = together(launchers, lambda client: client.post("/", **finalized("reg/" + key)).status_code)
    assert codes == [200] * 10
    record = cloud.registry.job("dup-job")
    assert record.attempt == 1 and vm_names(cloud) == [f"{OURS}dup-job-a1-0001"]
    assert cloud.compute_fake.calls["insert"] == 1
    assert [e["kind"] for e in cloud.registry.events("dup-job")].count("created") == 1


def test_capacity_errors_try_the_next_zone_then_wait_then_the_backstop_launches(cloud: GcpCloud) -> None:
    cloud.compute_fake.fail_zone("us-central1-a")
    record = submit(cloud, "zone-hop")
    assert record.zone == "us-central1-b" and vm_names(cloud) == [f"{OURS}zone-hop-a1-0001"]

    cloud.compute_fake.fail_zone("us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
    cloud.compute_fake.fail_zone("us-central1-b", "QUOTA_EXCEEDED")
    waiting = submit(cloud, "no-room")
    assert waiting.state == State.WAITING_CAPACITY and waiting.wait_until is not None
    assert "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in (waiting.last_error or "")
    cloud.compute_fake.restore_zone("us-central1-a")
    cloud.compute_fake.restore_zone("us-central1-b")
    cloud.compute.clock = lambda: time.time() + 120  # the retry comes after the backoff, in a later minute
    launcher.backstop(cloud.context(metrics=CountingMetrics()), now=waiting.wait_until + timedelta(seconds=1))
    again = cloud.registry.job("no-room")
    assert again.state == State.LAUNCHING and again.attempt == 1 and f"{OURS}no-room-a1-0001" in vm_names(cloud)


def test_spot_vm_gone_is_preempted_and_rerun_as_the_next_attempt(cloud: GcpCloud) -> None:
    record = submit(cloud, "spot-gone", SPEC + "spot: true\n")
    beat(cloud, record)
    call("sweeper")
    cloud.compute_fake.preempt(record.instances[0])  # no agent marker: the VM just vanished
    assert [p.instance_id for p in cloud.compute.preempted()] == record.instances
    metrics = CountingMetrics()
    (lost,) = reconcile.check(cloud.context(metrics=metrics), now=later(3))
    assert lost.action.rule == Rule.LOST_SPOT and cloud.registry.job("spot-gone").state == State.PREEMPTED
    assert [a["result"] for a in call("rerun")["actions"]] == ["applied"]
    after = cloud.registry.job("spot-gone")
    assert (after.state, after.attempt, after.restarts) == (State.LAUNCHING, 2, 1)
    assert vm_names(cloud) == [f"{OURS}spot-gone-a2-0001"] and cloud.registry.preempted() == {}


def preempted(cloud: GcpCloud, job_id: str, extra: str = "") -> None:
    """A Spot job that ran (its rank beat, the sweeper saw it) until GCE preempted its VM and its agent marked it."""
    record = submit(cloud, job_id, SPEC + "spot: true\n" + extra)
    beat(cloud, record)
    call("sweeper")
    cloud.compute_fake.preempt(record.instances[0])
    cloud.registry.mark_preempted(job_id, records.PreemptedMarker(attempt=1, rank=0, instance_id=record.instances[0],
                                                                  notice={"action": "terminate"}))


def test_overlapping_rerun_invocations_launch_one_attempt(cloud: GcpCloud) -> None:
    preempted(cloud, "spotty")
    reruns = [create_app("rerun", MAIN, "http").test_client() for _ in range(5)]
    results = together(reruns, lambda client: [a["result"] for a in client.post("/").get_json()["actions"]])
    assert len(results) == 5 and sum(r.count("applied") for r in results) == 1, results
    after = cloud.registry.job("spotty")
    assert (after.state, after.attempt) == (State.LAUNCHING, 2) and vm_names(cloud) == [f"{OURS}spotty-a2-0001"]
    assert cloud.compute_fake.calls["insert"] == 2  # attempt 1 and exactly one rerun


def test_no_restarts_left_fails_the_preempted_job(cloud: GcpCloud) -> None:
    preempted(cloud, "no-retry", "max_restarts: 0\n")
    call("rerun")
    final = cloud.registry.job("no-retry")
    assert (final.state, final.cause, final.reason) == (State.FAILED, Rule.RERUN_EXHAUSTED,
                                                        "preempted; no restarts left (max_restarts 0)")
    assert vm_names(cloud) == []


def test_uptime_cap_asks_to_stop_then_times_out(cloud: GcpCloud) -> None:
    record = submit(cloud, "runaway", SPEC + "max_runtime: 1h\n")
    [vm] = cloud.compute_fake.instances()
    assert vm["scheduling"]["maxRunDuration"] == {"seconds": "3600"}  # and GCE enforces it natively
    beat(cloud, record)
    call("sweeper")
    metrics = CountingMetrics()
    (stop,) = reconcile.uptime_cap(cloud.context(metrics=metrics), now=later(55))
    assert stop.action.rule == Rule.STOP and cloud.registry.get_json(keys.stop_request("runaway"))
    (cap,) = reconcile.uptime_cap(cloud.context(metrics=metrics), now=later(61))
    final = cloud.registry.job("runaway")
    assert cap.result == "applied" and (final.state, final.cause) == (State.TIMED_OUT, Rule.TIMED_OUT)
    assert final.reason == "uptime cap 1h reached"
    assert vm_names(cloud) == [] and metrics.totals["Timeouts"] == 1


def test_orphan_is_deleted_after_the_grace_and_foreign_vms_are_untouched(cloud: GcpCloud) -> None:
    cloud.compute_fake.add_instance("us-central1-a", f"{OURS}ghost-a1-0001", {
        "jobplane-managed": "true", "jobplane-deployment": deployment_label(DEPLOYMENT), "jobplane-job-id": "ghost",
        "jobplane-attempt": "1"})
    cloud.compute_fake.add_instance("us-central1-a", "jobplane-abcdef-ghost-a1-0001", {  # another deployment's
        "jobplane-managed": "true", "jobplane-deployment": "staging", "jobplane-job-id": "ghost",
        "jobplane-attempt": "1"})
    cloud.compute_fake.add_instance("us-central1-a", "web-server", {"team": "web"})
    cloud.compute_fake.add_instance("us-central1-a", "not-managed", {
        "jobplane-managed": "false", "jobplane-job-id": "ghost"})
    metrics = CountingMetrics()
    assert reconcile.check(cloud.context(metrics=metrics), now=later(5)) == []
    (orphan,) = reconcile.check(cloud.context(metrics=metrics), now=later(11))
    assert orphan.action.rule == Rule.ORPHAN and orphan.result == "applied"
    assert vm_names(cloud) == ["jobplane-abcdef-ghost-a1-0001", "not-managed", "web-server"]
    assert metrics.totals["OrphansTerminated"] == 1
    far = later(60 * 24 * 30)
    assert reconcile.check(cloud.context(metrics=metrics), now=far, force=True) == []
    assert reconcile.uptime_cap(cloud.context(metrics=metrics), now=far, force=True) == []


def test_silent_job_is_stalled_and_deleted(cloud: GcpCloud) -> None:
    record = submit(cloud, "quiet", SPEC + "stall_timeout: 5m\n")
    beat(cloud, record)
    call("sweeper")
    metrics = CountingMetrics()
    (stalled,) = reconcile.check(cloud.context(metrics=metrics), now=later(6))
    assert stalled.action.rule == Rule.STALLED and cloud.registry.job("quiet").state == State.STALLED
    assert vm_names(cloud) == [] and metrics.totals["Stalls"] == 1


# ---- the real agent on the GCP adapters ----------------------------------------------------------------
FAST = ["--log-interval", "0.3", "--heartbeat-interval", "0.5", "--checkpoint-interval", "0.3",
        "--poll-interval", "0.2", "--cluster-timeout", "30"]


def code_bundle() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(REPO / "examples" / "train" / "train.py", arcname="train.py")
    return buf.getvalue()


@pytest.fixture
def agents(cloud: GcpCloud, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start the agent for one VM (extra flags override FAST): its own fake metadata server, fake GCS,
    power-off shimmed."""
    procs: list[subprocess.Popen[bytes]] = []
    poweroff = tmp_path / "poweroff.log"
    shim = tmp_path / "poweroff-shim"
    shim.write_text(f'#!/bin/sh\necho "$0 $@" >> "{poweroff}"\n')
    shim.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("shutdown", "poweroff", "halt"):  # if anything fell back to the real command
        (bin_dir / name).write_text(f'#!/bin/sh\necho REAL {name} "$@" >> "{poweroff}"\n')
        (bin_dir / name).chmod(0o755)

    def start(instance_id: str, *extra: str) -> subprocess.Popen[bytes]:
        metadata = cloud.compute_fake.metadata_server(instance_id)
        node = tmp_path / instance_id.replace("/", "_")
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "STORAGE_EMULATOR_HOST": cloud.gcs_fake.endpoint, "GOOGLE_CLOUD_PROJECT": PROJECT}
        env.pop("JOBPLANE_JOB_ID", None)
        env.pop("JOBPLANE_ATTEMPT", None)  # job and attempt come from the VM's metadata attributes
        with (tmp_path / f"{node.name}.console").open("wb") as console:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobplane.agent", "--cloud", "gcp", "--bucket", BUCKET, "--root", "reg",
                 "--region", REGION, "--metadata-url", metadata.base_url, "--ml-root", str(node),
                 "--poweroff-cmd", str(shim), *FAST, *extra], env=env, stdout=console, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        assert "REAL" not in (poweroff.read_text() if poweroff.exists() else "")


def log_text(cloud: GcpCloud, job_id: str, attempt: int) -> str:
    chunks = [k for k, _, _ in cloud.registry.listing(keys.logs_prefix(data_of(cloud.registry, job_id), attempt, 0))]
    return "".join(cloud.registry.get_bytes(k).decode() for k in chunks)


def test_spot_preemption_then_resume_with_the_real_agent(
        cloud: GcpCloud, agents: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    job = "resume-me"
    cloud.registry.store.put(cloud.registry.key(keys.code_bundle(keys.JobData(job, keys.DEFAULT_OWNER))), code_bundle())
    # attempt 2 (the resumed run the test waits out) at a faster pace than attempt 1
    spec = (f"run: {paced(f'{sys.executable} train.py --steps 300 --checkpoint-every 20', 0.03, 0.005)}\n"
            "instance_type: n2-standard-4\ncloud: gcp\nzones: [us-central1-a]\nspot: true\nstop_grace: 5s\n")
    first = submit(cloud, job, spec)
    agent1 = agents(first.instances[0])
    prefix = keys.checkpoints_prefix(data_of(cloud.registry, job))
    wait_for("a synced checkpoint", lambda: list(cloud.registry.listing(prefix)))
    call("sweeper")  # heartbeats seen: RUNNING
    assert cloud.registry.job(job).state == State.RUNNING

    cloud.compute_fake.preempt(first.instances[0], notice_only=True)  # instance/preempted -> TRUE
    assert agent1.wait(timeout=60) is not None
    assert "poweroff-shim" in (tmp_path / "poweroff.log").read_text()
    marker = cloud.registry.get_json(keys.preempted_marker(job))
    assert marker["attempt"] == 1 and marker["instance_id"] == first.instances[0]
    assert cloud.registry.get_json(keys.exit_report(job, 1, 0))["reason"] == "preempted"
    cloud.compute_fake.preempt(first.instances[0])  # ~30 s later GCE deletes the VM

    assert [a["result"] for a in call("rerun")["actions"]] == ["applied"]
    second = cloud.registry.job(job)
    assert second.attempt == 2 and second.instances == [f"us-central1-a/{OURS}resume-me-a2-0001"]
    assert agents(second.instances[0]).wait(timeout=90) == 0
    cloud.compute_fake.power_off(second.instances[0])  # what the shimmed power-off does on a real VM
    call("sweeper")
    final = cloud.registry.job(job)
    assert final.state == State.SUCCEEDED and final.restarts == 1
    resumed = log_text(cloud, job, 2)
    assert "resuming from step" in resumed and "starting from step 0" not in resumed, resumed[:500]
    assert "starting from step 0" in log_text(cloud, job, 1)
    assert_vms_deleted(cloud)
    artifacts = keys.artifacts_prefix(data_of(cloud.registry, job))
    result = json.loads(cloud.registry.get_bytes(artifacts + "model/result.json"))
    assert result["steps"] == 300


def test_sigterm_before_the_notice_poll_keeps_the_newest_checkpoint_and_the_report(
        cloud: GcpCloud, agents: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """GCE preempts a Spot VM: instance/preempted turns TRUE and its shutdown script SIGTERMs the agent
    right away, before the agent's next metadata poll (5 s apart here, the most the contract allows).
    Periodic checkpoint uploads are held off (60 s), so every checkpoint in the bucket is the final sync's."""
    job = "shut-down"
    cloud.registry.store.put(cloud.registry.key(keys.code_bundle(keys.JobData(job, keys.DEFAULT_OWNER))), code_bundle())
    spec = (f"run: {paced(f'{sys.executable} train.py --steps 300 --checkpoint-every 10', 0.05, 0.005)}\n"
            "instance_type: n2-standard-4\ncloud: gcp\nzones: [us-central1-a]\nspot: true\n")
    vm = submit(cloud, job, spec).instances[0]
    metadata = cloud.compute_fake.metadata_server(vm)
    node = tmp_path / vm.replace("/", "_")
    agent = agents(vm, "--poll-interval", "5", "--checkpoint-interval", "60")
    wait_for("a checkpoint on the VM's disk", lambda: list((node / "checkpoints").glob("ckpt-*.npz")))
    call("sweeper")
    assert cloud.registry.job(job).state == State.RUNNING
    prefix = keys.checkpoints_prefix(data_of(cloud.registry, job))
    assert not list(cloud.registry.listing(prefix))  # nothing uploaded yet

    polls = metadata.requests  # after boot the agent asks its metadata server only for instance/preempted
    wait_for("the agent's next notice poll", lambda: metadata.requests > polls)
    cloud.compute_fake.preempt(vm, notice_only=True)  # the next poll is ~5 s away: the signal comes first
    script = tmp_path / "shutdown-script"
    script.write_text(shutdown_script(agent_match=f"-m jobplane[.]agent .*{node}"))  # this test's agent only
    shutdown = subprocess.Popen(["bash", str(script)], stderr=subprocess.PIPE, text=True)
    try:
        def agent_exited() -> bool:
            if agent.poll() is None:  # (poll() reaps it: until then its pid exists for the script)
                assert shutdown.poll() is None, "the shutdown script returned while the agent still ran"
                return False
            return True
        wait_for("the agent to finish after SIGTERM", agent_exited)
        _, stderr = shutdown.communicate(timeout=30)
    finally:
        shutdown.kill()
    assert shutdown.returncode == 0 and not stderr, stderr  # it waited for the agent, and not in vain

    report = cloud.registry.get_json(keys.exit_report(job, 1, 0))
    # train.py saves its step on SIGTERM and exits 0
    assert (report["reason"], report["code"], report["notice"]["action"]) == ("preempted", 0, "terminate")
    assert metadata.requests == polls + 2  # that poll, then one look after the signal
    log1 = log_text(cloud, job, 1)
    assert "SIGTERM received" in log1 and "SIGTERM: preempted" in log1, log1[-2000:]
    assert cloud.registry.get_json(keys.preempted_marker(job))["attempt"] == 1
    on_disk = {p.name for p in (node / "checkpoints").glob("ckpt-*.npz")}
    newest = max(on_disk, key=lambda name: int(name.split("-")[1].split(".")[0]))
    prefix = keys.checkpoints_prefix(data_of(cloud.registry, job))
    synced = {k.rsplit("/", 1)[-1] for k, _, _ in cloud.registry.listing(prefix)}
    assert newest in synced and on_disk <= synced
    assert "poweroff-shim" in (tmp_path / "poweroff.log").read_text()

    cloud.compute_fake.preempt(vm)  # GCE deletes the VM
    assert [a["result"] for a in call("rerun")["actions"]] == ["applied"]
    second = cloud.registry.job(job)
    assert second.attempt == 2
    assert agents(second.instances[0]).wait(timeout=90) == 0
    step = newest.split("-")[1].split(".")[0]
    assert f"resuming from step {step} ({newest})" in log_text(cloud, job, 2)


def test_a_vm_whose_bootstrap_fails_fails_the_job_at_once_with_its_serial_console_saved(
        cloud: GcpCloud, tmp_path: Path) -> None:
    """The VM runs the real startup script (its agent bundle is not in this registry), which reports the
    failure through GCS; the finalize event sends it to the sweeper, which keeps the serial console output."""
    record = submit(cloud, "no-agent")
    (instance_id,) = record.instances
    vm = next(v for v in cloud.compute_fake.instances() if v["name"] == instance_id.split("/")[1])
    script = next(i["value"] for i in vm["metadata"]["items"] if i["key"] == "startup-script")
    metadata = cloud.compute_fake.metadata_server(instance_id)
    booted = run_bootstrap(script, tmp_path, GCE_METADATA_HOST=metadata.host)
    assert booted.returncode == 1
    cloud.compute_fake.set_console(instance_id, booted.stdout)  # what GCE keeps of the guest's serial port
    key = keys.boot_failure("no-agent", 1)
    assert keys.job_named_by(key) == "no-agent"
    response = create_app("launcher", MAIN, "cloudevent").test_client().post("/", **finalized("reg/" + key))
    assert response.status_code == 200
    failed = cloud.registry.job("no-agent")
    assert (failed.state, failed.cause) == (State.FAILED, Rule.BOOT_FAILED)
    # the bootstrap's own words and where its console output is: a message for people, checked as such
    assert failed.reason.startswith("the agent could not start: cannot download the agent bundle gcp-py3.")
    assert "HTTP Error 404" in failed.reason and "`jobplane logs no-agent --attempt 1`" in failed.reason
    console = cloud.registry.get_bytes(keys.console_log(data_of(cloud.registry, "no-agent"), 1, 0)).decode()
    assert f"console output of {instance_id}" in console and "jobplane-bootstrap: FAILED:" in console
    assert_vms_deleted(cloud)
