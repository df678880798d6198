"""The reconcilers on moto (in-process S3 + EC2), for what rests on EC2's and S3's own behaviour: requests a
healthy job costs, tags, termination protection, dry runs and blast radius on real instances, console output.
Scenarios over time are told in memory (test_day.py); tests/clouds/test_compute_conformance.py holds
MemoryCompute to EC2's semantics.

Instances' LaunchTime and listings' LastModified are wall-clock; a test moves time forward by passing a
later `now`, as a later cron run would see it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobplane.clouds.base import TAG_DEPLOYMENT, TAG_JOB_ID, TAG_MANAGED
from jobplane.control import reconcile
from jobplane.control.reconcile import Result
from jobplane.decide.model import Rule
from jobplane.local.moto_server import CONSOLES_ENV
from jobplane.model import keys, records
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from tests.helpers import crash_on_event_writes
from tests.moto_aws import BUCKET, SPEC, MotoAws, beat, launch, report_exit

pytestmark = pytest.mark.timeout(120)


def later(minutes: float) -> datetime:
    return utcnow() + timedelta(minutes=minutes)


def sweep(c: MotoAws, *, now: datetime, dry_run: bool = False, **kwargs: Any) -> list[reconcile.Outcome]:
    return reconcile.check(c.context(dry_run=dry_run), now=now, **kwargs)


def uptime_cap(c: MotoAws, *, now: datetime, **kwargs: Any) -> list[reconcile.Outcome]:
    return reconcile.uptime_cap(c.context(), now=now, **kwargs)


def rerun(c: MotoAws, *, now: datetime, **kwargs: Any) -> list[reconcile.Outcome]:
    return reconcile.rerun(c.context(), now=now, **kwargs)


def run_raw(c: MotoAws, count: int = 1, tags: dict[str, str] | None = None) -> list[str]:
    extra: dict[str, Any] = {}
    if tags:
        extra["TagSpecifications"] = [{"ResourceType": "instance",
                                       "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    resp = c.ec2.run_instances(ImageId=c.image, MinCount=count, MaxCount=count, **extra)
    return [i["InstanceId"] for i in resp["Instances"]]


def states(c: MotoAws) -> dict[str, str]:
    return {i["InstanceId"]: i["State"]["Name"] for i in c.instances()}


def alive(c: MotoAws, ids: list[str]) -> bool:
    got = states(c)
    return all(got[i] in ("pending", "running") for i in ids)


OURS = {TAG_MANAGED: "true", TAG_DEPLOYMENT: BUCKET}  # what this deployment tags its VMs with
ORPHAN = {TAG_MANAGED: "true", TAG_DEPLOYMENT: BUCKET, TAG_JOB_ID: "ghost"}


def test_lifecycle_started_then_healthy_then_finished(moto_aws: MotoAws) -> None:
    record = launch(moto_aws, "train")
    beat(moto_aws, record)
    (started,) = sweep(moto_aws, now=utcnow())
    assert started.action.rule == Rule.STARTED and started.result == "applied"
    assert moto_aws.registry.job("train").state == State.RUNNING
    assert [k for k, _, _ in moto_aws.registry.listing(keys.ACTIVE)] == [
        "active/train/RUNNING.1.nodes-1.stall-1800.cap-86400"]  # its limits ride in its marker's name
    assert moto_aws.registry.job("train").limits == "nodes-1.stall-1800.cap-86400"

    gets: list[str] = []
    moto_aws.s3.meta.events.register("before-call.s3.GetObject", lambda params, **_: gets.append(params["url_path"]))
    assert sweep(moto_aws, now=utcnow()) == []
    assert not [g for g in gets if g.endswith("/job.json")], "a healthy job costs the check no GET"

    # Every VM may write any job's facts: another job's VM "finishes" and "preempts" this one. Ignored, with
    # one event each; the job runs on.
    other = "i-0another0jobs0vm"
    moto_aws.registry.put_json(keys.exit_report("train", 1, 0), records.ExitReport(code=0, instance_id=other).body())
    moto_aws.registry.mark_preempted("train", records.PreemptedMarker(attempt=1, instance_id=other))
    for expected in ([(Rule.IGNORED, "applied")], []):  # the second run sees the event's flag: nothing more
        outcomes = sweep(moto_aws, now=utcnow(), jobs=["train"])
        assert [(o.action.rule, o.result) for o in outcomes] == expected
    (ignored,) = rerun(moto_aws, now=utcnow())
    assert ignored.action.rule == Rule.IGNORED and ignored.result == "applied"
    assert moto_aws.registry.preempted() == {}, "the marker is cleared"
    assert moto_aws.registry.job("train").state == State.RUNNING and alive(moto_aws, record.instances)
    events = [e for e in moto_aws.registry.events("train") if e["kind"] == "ignored-fact"]
    assert [(e["key"], e["why"]) for e in events] == [
        (keys.exit_report("train", 1, 0), f"written by {other}, not an instance of attempt 1"),
        (keys.preempted_marker("train"), f"names {other} of attempt 1, not an instance of attempt 1")]
    assert moto_aws.metrics.totals["IgnoredFacts"] == 2

    report_exit(moto_aws, record, 0)  # the job's own agent: that report counts
    event_job = keys.job_named_by(keys.exit_report("train", 1, 0))
    (done,) = sweep(moto_aws, now=utcnow(), jobs=[event_job])
    assert done.action.rule == Rule.FINISHED and done.result == "applied"
    final = moto_aws.registry.job("train")
    assert final.state == State.SUCCEEDED and final.exit_code == 0
    assert not alive(moto_aws, record.instances) and moto_aws.metrics.totals["JobsSucceeded"] == 1
    assert moto_aws.registry.active() == {}


def test_a_sweep_completes_the_history_a_crash_after_the_cas_left_short(
        moto_aws: MotoAws, monkeypatch: pytest.MonkeyPatch) -> None:
    record = launch(moto_aws, "train")
    beat(moto_aws, record)
    with monkeypatch.context() as crashing:
        crash_on_event_writes(moto_aws.registry, crashing, "running")
        (started,) = sweep(moto_aws, now=utcnow())
    assert started.action.rule == Rule.STARTED and started.result == Result.ERROR
    assert moto_aws.registry.job("train").state == State.RUNNING
    assert "running" not in [e["kind"] for e in moto_aws.registry.events("train")], "the crash lost the event"

    sweep(moto_aws, now=utcnow())
    kinds = [e["kind"] for e in moto_aws.registry.events("train")]
    assert kinds == ["created", "launching", "launching", "running"], \
        "created, claim, launch, then the lost event once, in write order"
    assert [m.state for m in moto_aws.registry.active()["train"]] == [State.RUNNING]


def test_dry_run_applies_nothing(moto_aws: MotoAws) -> None:
    moto_aws.set_policy(f"aws:\n  default_image: {moto_aws.image}\nsafety:\n  max_terminations_percent: 100\n")
    orphan = run_raw(moto_aws, tags=ORPHAN)
    record = launch(moto_aws, "stuck")  # LAUNCHING, never beats: boot timeout
    before = moto_aws.registry.job("stuck")

    outcomes = sweep(moto_aws, now=later(60), dry_run=True)
    moto_aws.set_policy(f"aws:\n  default_image: {moto_aws.image}\nsafety:\n  dry_run: true\n"
                     "  max_terminations_percent: 100\n")
    outcomes += uptime_cap(moto_aws, now=later(60 * 24 * 8))

    assert {o.action.rule for o in outcomes} == {Rule.ORPHAN, Rule.BOOT_RETRY, Rule.TIMED_OUT, Rule.CAP_NO_JOB}
    assert {o.result for o in outcomes} == {reconcile.Result.DRY_RUN}
    assert alive(moto_aws, orphan + record.instances)
    assert moto_aws.registry.job("stuck") == before
    assert len(moto_aws.calls.run_instances) == 2  # the orphan's + attempt 1
    assert moto_aws.metrics.totals.get("OrphansTerminated", 0) == 0


def test_blast_radius_stops_a_mass_termination(moto_aws: MotoAws) -> None:
    moto_aws.set_policy(f"aws:\n  default_image: {moto_aws.image}\nsafety:\n  max_terminations_per_run: 2\n"
                     "  max_terminations_percent: 100\n")
    orphans = run_raw(moto_aws, 5, ORPHAN)

    outcomes = sweep(moto_aws, now=later(11))

    assert sorted(o.result for o in outcomes) == ["applied"] * 2 + ["refused"] * 3
    assert sum(states(moto_aws)[i] in ("pending", "running") for i in orphans) == 3
    assert moto_aws.metrics.totals["BlastRadiusRefusals"] == 3 and moto_aws.metrics.totals["OrphansTerminated"] == 2
    forced = sweep(moto_aws, now=later(11), force=True)
    assert [o.result for o in forced] == ["applied"] * 3 and not any(
        states(moto_aws)[i] in ("pending", "running") for i in orphans)


def test_refusals_and_terminations_go_into_the_history_of_jobs_that_have_one(moto_aws: MotoAws) -> None:
    moto_aws.set_policy(f"aws:\n  default_image: {moto_aws.image}\nsafety:\n  max_terminations_per_run: 0\n")
    old = launch(moto_aws, "old")
    moto_aws.registry.transition("old", State.LAUNCHING, expect={State.LAUNCHING}, attempt=2, instances=[],
                              launched_at=None, now=later(9))  # attempt 1 is past, attempt 2 is launching
    run_raw(moto_aws, 1, ORPHAN)  # a job nobody recorded: no history to write to

    outcomes = sweep(moto_aws, now=later(11))
    assert sorted((o.action.job_id, o.action.rule, o.result) for o in outcomes) == [
        ("ghost", Rule.ORPHAN, "refused"), ("old", Rule.ORPHAN, "refused")]
    (refused,) = [e for e in moto_aws.registry.events("old") if e["kind"] == "refused"]
    assert (refused["rule"], refused["instances"]) == (Rule.ORPHAN, old.instances)
    assert "blast radius" in refused["refused"]

    moto_aws.set_policy(f"aws:\n  default_image: {moto_aws.image}\nsafety:\n  max_terminations_percent: 100\n")
    outcomes = sweep(moto_aws, now=later(12))
    assert [(o.action.rule, o.result) for o in outcomes] == [(Rule.ORPHAN, reconcile.Result.APPLIED)] * 2
    (terminated,) = [e for e in moto_aws.registry.events("old") if e["kind"] == "terminated"]
    assert (terminated["rule"], terminated["instances"]) == (Rule.ORPHAN, old.instances)
    assert list(moto_aws.registry.listing(keys.events_prefix("ghost"))) == []


def test_untagged_and_unmanaged_instances_are_untouched(moto_aws: MotoAws) -> None:
    foreign = run_raw(moto_aws) + run_raw(moto_aws, tags={TAG_MANAGED: "false", TAG_JOB_ID: "ghost"})
    far = later(60 * 24 * 30)
    outcomes = sweep(moto_aws, now=far, force=True)
    outcomes += uptime_cap(moto_aws, now=far, force=True)
    assert outcomes == [] and alive(moto_aws, foreign)




def test_past_attempt_instances_are_orphans_and_protected_ones_stay(moto_aws: MotoAws) -> None:
    moto_aws.set_policy(f"aws:\n  default_image: {moto_aws.image}\nsafety:\n  max_terminations_percent: 100\n")
    old = run_raw(moto_aws, tags={**OURS, TAG_JOB_ID: "train", "jobplane:attempt": "1"})
    kept = run_raw(moto_aws, tags={**OURS, TAG_JOB_ID: "train", "jobplane:attempt": "1"})
    moto_aws.ec2.modify_instance_attribute(InstanceId=kept[0], DisableApiTermination={"Value": True})
    record = launch(moto_aws, "train")  # attempt 1 by the registry: the raw ones carry attempt 1 too...
    moto_aws.registry.transition("train", State.LAUNCHING, expect={State.LAUNCHING}, attempt=2)  # ...now past
    sweep(moto_aws, now=later(11))
    got = states(moto_aws)
    assert got[old[0]] not in ("pending", "running") and got[kept[0]] in ("pending", "running")
    assert got[record.instances[0]] not in ("pending", "running")  # attempt 1's own VM, also past






def test_uptime_cap_stops_then_times_out(moto_aws: MotoAws) -> None:
    record = launch(moto_aws, "long", SPEC + "max_runtime: 1h\n")
    beat(moto_aws, record)
    sweep(moto_aws, now=utcnow())
    (stop,) = uptime_cap(moto_aws, now=later(55))
    assert stop.action.rule == Rule.STOP and moto_aws.registry.get_json(keys.stop_request("long"))["by"] == "uptime-cap"
    (cap,) = uptime_cap(moto_aws, now=later(61))
    final = moto_aws.registry.job("long")
    assert cap.result == "applied" and final.state == State.TIMED_OUT and final.reason == "uptime cap 1h reached"
    assert not alive(moto_aws, record.instances) and moto_aws.metrics.totals["Timeouts"] == 1
    history = {e["kind"]: e for e in moto_aws.registry.events("long")}
    assert (history["stop-requested"]["by"], history["stop-requested"]["rule"]) == ("uptime-cap", Rule.STOP)
    assert (history["terminated"]["instances"], history["terminated"]["rule"]) == (record.instances, Rule.TIMED_OUT)


def test_a_stop_on_match_stops_the_peers_then_fails_the_job_without_a_rerun(moto_aws: MotoAws) -> None:
    record = launch(moto_aws, "nan", SPEC + "num_nodes: 2\nspot: true\nstop_on: {nan: true}\n")
    beat(moto_aws, record)
    sweep(moto_aws, now=utcnow())  # -> RUNNING
    why = 'loss became nan at step 40: "step 40 loss nan"'
    report_exit(moto_aws, record, 0, reason="early-stop", error=why)
    (ask,) = sweep(moto_aws, now=utcnow(), jobs=["nan"])
    assert ask.action.rule == Rule.STOP_PEERS and ask.result == "applied"
    assert moto_aws.registry.get_json(keys.stop_request("nan"))["by"] == "sweeper"
    assert moto_aws.registry.job("nan").state == State.RUNNING and alive(moto_aws, record.instances)

    report_exit(moto_aws, record, 143, rank=1, reason="stopped")
    (failed,) = sweep(moto_aws, now=utcnow(), jobs=["nan"])
    final = moto_aws.registry.job("nan")
    assert failed.action.rule == Rule.EARLY_STOP and final.state == State.FAILED and final.attempt == 1
    assert final.reason == f"stopped: {why} (rank 0)" and final.exit_code == 0
    assert not alive(moto_aws, record.instances) and moto_aws.registry.preempted() == {}
    assert rerun(moto_aws, now=utcnow()) == []


def test_a_failed_rank_ends_a_multi_node_attempt_at_once(moto_aws: MotoAws) -> None:
    record = launch(moto_aws, "ddp", SPEC + "num_nodes: 3\n")
    beat(moto_aws, record)
    sweep(moto_aws, now=utcnow())  # -> RUNNING
    report_exit(moto_aws, record, 1, rank=2, error="CUDA error: out of memory")
    (failed,) = sweep(moto_aws, now=utcnow(), jobs=["ddp"])
    final = moto_aws.registry.job("ddp")
    assert failed.action.rule == Rule.RANK_FAILED and failed.result == "applied", failed
    assert final.state == State.FAILED and final.exit_code == 1
    assert final.reason == ("rank 2 exited with code 1: CUDA error: out of memory; ending the attempt (terminating "
                            "rank 0, 1)")
    assert not alive(moto_aws, record.instances), "ranks 0 and 1 would wait in their next collective"


def test_spot_warning_recorded_once(moto_aws: MotoAws) -> None:
    record = launch(moto_aws, "warned", SPEC + "spot: true\n")
    iid = record.instances[0]
    detail = {"instance-id": iid, "instance-action": "terminate"}
    reg, compute = moto_aws.registry, moto_aws.compute
    assert reconcile.record_spot_warning(reg, compute, iid, now=utcnow(), detail=detail) == "recorded"
    assert reconcile.record_spot_warning(reg, compute, iid, now=utcnow(), detail=detail) == "duplicate"
    assert reconcile.record_spot_warning(reg, compute, "i-nope", now=utcnow()) == "ignored"
    (notice,) = moto_aws.registry.job("warned").notices
    assert notice["instance_id"] == iid and notice["action"] == "terminate" and notice["attempt"] == 1
    assert any(e["kind"] == "spot-warning" for e in moto_aws.registry.events("warned"))


def test_a_vm_whose_agent_never_started_leaves_its_console_output_in_the_logs(
        moto_aws: MotoAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GetConsoleOutput (moto serving what the instance printed) is read before the VM is terminated."""
    monkeypatch.setenv(CONSOLES_ENV, str(tmp_path))
    record = launch(moto_aws, "silent", SPEC + "max_restarts: 0\n")
    (instance_id,) = record.instances
    (tmp_path / instance_id).mkdir()
    (tmp_path / instance_id / "console.log").write_text("jobplane-bootstrap: FAILED: no python3 on this image\n")
    (failed,) = sweep(moto_aws, now=later(16))
    assert failed.action.rule == Rule.BOOT_FAILED and failed.result == "applied"
    record = moto_aws.registry.job("silent")
    assert (record.cause, record.reason) == (Rule.BOOT_FAILED, "the agent never started: no heartbeat from rank 0 "
                                             "within boot_timeout 15m (the VM's console output is in `jobplane logs "
                                             "silent --attempt 1`); no restarts left (max_restarts 0)")
    saved = moto_aws.registry.get_bytes(keys.console_log(moto_aws.registry.job("silent").data, 1, 0)).decode()
    header = f"---- console output of {instance_id} (rank 0, attempt 1), saved by the sweeper ----"
    assert saved.splitlines() == [header, "jobplane-bootstrap: FAILED: no python3 on this image"]
    assert not alive(moto_aws, [instance_id])
