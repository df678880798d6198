"""The reconcilers end to end on moto (in-process S3 + EC2): real launches, real listings, real terminations.

Instances' LaunchTime and listings' LastModified are wall-clock; a test moves time forward by passing a
later `now`, as a later cron run would see it.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobplane import keys, launcher, reconcile, records
from jobplane.clouds.base import TAG_JOB_ID, TAG_MANAGED
from jobplane.decide.model import Rule
from jobplane.local.moto_server import CONSOLES_ENV
from jobplane.reconcile import Result
from jobplane.registry import JobRecord, utcnow
from jobplane.spec import parse_spec
from jobplane.states import State
from tests.launcher.conftest import Cloud, cloud  # noqa: F401  (the shared moto fixture)
from tests.test_registry import crash_on_event_writes

pytestmark = pytest.mark.timeout(120)
SPEC = "run: python3 train.py\ninstance_type: t3.micro\n"


def later(minutes: float) -> datetime:
    return utcnow() + timedelta(minutes=minutes)


def launch(c: Cloud, job_id: str, spec: str = SPEC) -> JobRecord:
    c.registry.create_job(job_id, parse_spec(spec, job_id))
    return launcher.launch_attempt(c.registry, c.compute, job_id, now=utcnow(), expect={State.QUEUED},
                                   expect_attempt=0, metrics=c.metrics)


def beat(c: Cloud, record: JobRecord) -> None:
    for rank in range(record.spec.num_nodes):
        c.registry.put_json(keys.heartbeat(record.id, record.attempt, rank), {"time": utcnow().isoformat()})
    c.registry.put_json(keys.output_mark(record.id, record.attempt, 0), {"time": utcnow().isoformat()})


def report_exit(c: Cloud, record: JobRecord, code: int, rank: int = 0, **more: Any) -> None:
    """The exit report the agent on that rank's VM writes."""
    c.registry.put_json(keys.exit_report(record.id, record.attempt, rank),
                        records.ExitReport(code=code, instance_id=record.instances[rank], **more).body())


def run_raw(c: Cloud, count: int = 1, tags: dict[str, str] | None = None) -> list[str]:
    extra: dict[str, Any] = {}
    if tags:
        extra["TagSpecifications"] = [{"ResourceType": "instance",
                                       "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    resp = c.ec2.run_instances(ImageId=c.image, MinCount=count, MaxCount=count, **extra)
    return [i["InstanceId"] for i in resp["Instances"]]


def states(c: Cloud) -> dict[str, str]:
    return {i["InstanceId"]: i["State"]["Name"] for i in c.instances()}


def alive(c: Cloud, ids: list[str]) -> bool:
    got = states(c)
    return all(got[i] in ("pending", "running") for i in ids)


ORPHAN = {TAG_MANAGED: "true", TAG_JOB_ID: "ghost"}


def test_lifecycle_started_then_healthy_then_finished(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "train")
    beat(cloud, record)
    (started,) = reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                                 policy=cloud.registry.policy())
    assert started.action.rule == Rule.STARTED and started.result == "applied"
    assert cloud.registry.job("train").state == State.RUNNING
    assert [k for k, _, _ in cloud.registry.listing(keys.LIMITS)] == ["limits/train/1/nodes-1.stall-1800.cap-86400"]

    gets: list[str] = []
    cloud.s3.meta.events.register("before-call.s3.GetObject", lambda params, **_: gets.append(params["url_path"]))
    assert reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                           policy=cloud.registry.policy()) == []
    assert not [g for g in gets if g.endswith("/job.json")], "a healthy job costs the sweep no GET"

    # Every VM may write any job's facts: another job's VM "finishes" and "preempts" this one. Ignored, with
    # one event each; the job runs on.
    other = "i-0another0jobs0vm"
    cloud.registry.put_json(keys.exit_report("train", 1, 0), records.ExitReport(code=0, instance_id=other).body())
    cloud.registry.mark_preempted("train", records.PreemptedMarker(attempt=1, instance_id=other).body())
    for expected in ([(Rule.IGNORED, "applied")], []):  # the second run sees the event's flag: nothing more
        outcomes = reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics, jobs=["train"],
                                   policy=cloud.registry.policy())
        assert [(o.action.rule, o.result) for o in outcomes] == expected
    (ignored,) = reconcile.rerun(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                                 policy=cloud.registry.policy())
    assert ignored.action.rule == Rule.IGNORED and ignored.result == "applied"
    assert cloud.registry.preempted() == {}, "the marker is cleared"
    assert cloud.registry.job("train").state == State.RUNNING and alive(cloud, record.instances)
    events = [e for e in cloud.registry.events("train") if e["kind"] == "ignored-fact"]
    assert [(e["key"], e["why"]) for e in events] == [
        (keys.exit_report("train", 1, 0), f"written by {other}, not an instance of attempt 1"),
        (keys.preempted_marker("train"), f"names {other} of attempt 1, not an instance of attempt 1")]

    report_exit(cloud, record, 0)  # the job's own agent: that report counts
    event_job = keys.job_named_by(keys.exit_report("train", 1, 0))
    (done,) = reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics, jobs=[event_job],
                              policy=cloud.registry.policy())
    assert done.action.rule == Rule.FINISHED and done.result == "applied"
    final = cloud.registry.job("train")
    assert final.state == State.SUCCEEDED and final.exit_code == 0
    assert not alive(cloud, record.instances) and cloud.metrics.totals["JobsSucceeded"] == 1
    assert cloud.registry.active() == {}


def test_a_sweep_completes_the_history_a_crash_after_the_cas_left_short(
        cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    record = launch(cloud, "train")
    beat(cloud, record)
    with monkeypatch.context() as crashing:
        crash_on_event_writes(cloud.registry, crashing, "running")
        (started,) = reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                                     policy=cloud.registry.policy())
    assert started.action.rule == Rule.STARTED and started.result == Result.ERROR
    assert cloud.registry.job("train").state == State.RUNNING
    assert "running" not in [e["kind"] for e in cloud.registry.events("train")], "the crash lost the event"

    reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics, policy=cloud.registry.policy())
    kinds = [e["kind"] for e in cloud.registry.events("train")]
    assert kinds == ["created", "launching", "launching", "running"], \
        "created, claim, launch, then the lost event once, in write order"
    assert [m.state for m in cloud.registry.active()["train"]] == [State.RUNNING]


def test_dry_run_applies_nothing(cloud: Cloud) -> None:  # noqa: F811
    cloud.set_policy(f"aws:\n  default_image: {cloud.image}\nsafety:\n  max_terminations_percent: 100\n")
    orphan = run_raw(cloud, tags=ORPHAN)
    record = launch(cloud, "stuck")  # LAUNCHING, never beats: boot timeout
    before = cloud.registry.job("stuck")

    outcomes = reconcile.sweep(cloud.registry, cloud.compute, now=later(60), metrics=cloud.metrics, dry_run=True,
                               policy=cloud.registry.policy())
    cloud.set_policy(f"aws:\n  default_image: {cloud.image}\nsafety:\n  dry_run: true\n"
                     "  max_terminations_percent: 100\n")
    outcomes += reconcile.uptime_cap(cloud.registry, cloud.compute, now=later(60 * 24 * 8), metrics=cloud.metrics,
                                     policy=cloud.registry.policy())

    assert {o.action.rule for o in outcomes} == {Rule.ORPHAN, Rule.BOOT_RETRY, Rule.TIMED_OUT, Rule.CAP_NO_JOB}
    assert {o.result for o in outcomes} == {reconcile.Result.DRY_RUN}
    assert alive(cloud, orphan + record.instances)
    assert cloud.registry.job("stuck") == before and len(cloud.calls.run_instances) == 2  # the orphan's + attempt 1
    assert cloud.metrics.totals.get("OrphansTerminated", 0) == 0


def test_blast_radius_stops_a_mass_termination(cloud: Cloud) -> None:  # noqa: F811
    cloud.set_policy(f"aws:\n  default_image: {cloud.image}\nsafety:\n  max_terminations_per_run: 2\n"
                     "  max_terminations_percent: 100\n")
    orphans = run_raw(cloud, 5, ORPHAN)

    outcomes = reconcile.sweep(cloud.registry, cloud.compute, now=later(11), metrics=cloud.metrics,
                               policy=cloud.registry.policy())

    assert sorted(o.result for o in outcomes) == ["applied"] * 2 + ["refused"] * 3
    assert sum(states(cloud)[i] in ("pending", "running") for i in orphans) == 3
    assert cloud.metrics.totals["BlastRadiusRefusals"] == 3 and cloud.metrics.totals["OrphansTerminated"] == 2
    forced = reconcile.sweep(cloud.registry, cloud.compute, now=later(11), metrics=cloud.metrics, force=True,
                             policy=cloud.registry.policy())
    assert [o.result for o in forced] == ["applied"] * 3 and not any(
        states(cloud)[i] in ("pending", "running") for i in orphans)


def test_refusals_and_terminations_go_into_the_history_of_jobs_that_have_one(cloud: Cloud) -> None:  # noqa: F811
    cloud.set_policy(f"aws:\n  default_image: {cloud.image}\nsafety:\n  max_terminations_per_run: 0\n")
    old = launch(cloud, "old")
    cloud.registry.transition("old", State.LAUNCHING, expect={State.LAUNCHING}, attempt=2, instances=[],
                              launched_at=None)  # attempt 1 is past, attempt 2 is launching
    run_raw(cloud, 1, ORPHAN)  # a job nobody recorded: no history to write to

    outcomes = reconcile.sweep(cloud.registry, cloud.compute, now=later(11), metrics=cloud.metrics,
                               policy=cloud.registry.policy())
    assert sorted((o.action.job_id, o.action.rule, o.result) for o in outcomes) == [
        ("ghost", Rule.ORPHAN, "refused"), ("old", Rule.ORPHAN, "refused")]
    (refused,) = [e for e in cloud.registry.events("old") if e["kind"] == "refused"]
    assert (refused["rule"], refused["instances"]) == (Rule.ORPHAN, old.instances)
    assert "blast radius" in refused["refused"]

    cloud.set_policy(f"aws:\n  default_image: {cloud.image}\nsafety:\n  max_terminations_percent: 100\n")
    outcomes = reconcile.sweep(cloud.registry, cloud.compute, now=later(12), metrics=cloud.metrics,
                               policy=cloud.registry.policy())
    assert [(o.action.rule, o.result) for o in outcomes] == [(Rule.ORPHAN, reconcile.Result.APPLIED)] * 2
    (terminated,) = [e for e in cloud.registry.events("old") if e["kind"] == "terminated"]
    assert (terminated["rule"], terminated["instances"]) == (Rule.ORPHAN, old.instances)
    assert list(cloud.registry.listing(keys.events_prefix("ghost"))) == []


def test_untagged_and_unmanaged_instances_are_untouched(cloud: Cloud) -> None:  # noqa: F811
    foreign = run_raw(cloud) + run_raw(cloud, tags={TAG_MANAGED: "false", TAG_JOB_ID: "ghost"})
    far = later(60 * 24 * 30)
    outcomes = reconcile.sweep(cloud.registry, cloud.compute, now=far, metrics=cloud.metrics, force=True,
                               policy=cloud.registry.policy())
    outcomes += reconcile.uptime_cap(cloud.registry, cloud.compute, now=far, metrics=cloud.metrics, force=True,
                                     policy=cloud.registry.policy())
    assert outcomes == [] and alive(cloud, foreign)


def test_orphan_terminated_only_after_the_grace(cloud: Cloud) -> None:  # noqa: F811
    (orphan,) = run_raw(cloud, tags=ORPHAN)
    assert reconcile.sweep(cloud.registry, cloud.compute, now=later(5), metrics=cloud.metrics,
                           policy=cloud.registry.policy()) == []
    assert alive(cloud, [orphan])
    (out,) = reconcile.sweep(cloud.registry, cloud.compute, now=later(11), metrics=cloud.metrics,
                             policy=cloud.registry.policy())
    assert out.action.rule == Rule.ORPHAN and out.result == "applied" and not alive(cloud, [orphan])
    assert cloud.metrics.totals["OrphansTerminated"] == 1


def test_past_attempt_instances_are_orphans_and_protected_ones_stay(cloud: Cloud) -> None:  # noqa: F811
    cloud.set_policy(f"aws:\n  default_image: {cloud.image}\nsafety:\n  max_terminations_percent: 100\n")
    old = run_raw(cloud, tags={TAG_MANAGED: "true", TAG_JOB_ID: "train", "jobplane:attempt": "1"})
    kept = run_raw(cloud, tags={TAG_MANAGED: "true", TAG_JOB_ID: "train", "jobplane:attempt": "1"})
    cloud.ec2.modify_instance_attribute(InstanceId=kept[0], DisableApiTermination={"Value": True})
    record = launch(cloud, "train")  # attempt 1 by the registry: the raw ones carry attempt 1 too...
    cloud.registry.transition("train", State.LAUNCHING, expect={State.LAUNCHING}, attempt=2)  # ...now past
    reconcile.sweep(cloud.registry, cloud.compute, now=later(11), metrics=cloud.metrics, policy=cloud.registry.policy())
    got = states(cloud)
    assert got[old[0]] not in ("pending", "running") and got[kept[0]] in ("pending", "running")
    assert got[record.instances[0]] not in ("pending", "running")  # attempt 1's own VM, also past


def test_overlapping_reruns_launch_one_attempt(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "spotty", SPEC + "spot: true\n")
    cloud.registry.transition("spotty", State.RUNNING, expect={State.LAUNCHING})
    cloud.registry.mark_preempted("spotty", {"attempt": 1, "rank": 0, "instance_id": record.instances[0]})
    cloud.ec2.terminate_instances(InstanceIds=record.instances)
    results: list[list[reconcile.Outcome]] = []
    barrier = threading.Barrier(5)

    def run() -> None:
        barrier.wait()
        results.append(reconcile.rerun(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                                       policy=cloud.registry.policy()))

    threads = [threading.Thread(target=run) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    after = cloud.registry.job("spotty")
    assert len(results) == 5
    assert after.state == State.LAUNCHING and after.attempt == 2 and after.restarts == 1
    assert len(cloud.calls.run_instances) == 2, "attempt 1 and exactly one rerun"
    assert sum(o.result == "applied" and o.action.rule == Rule.RERUN for r in results for o in r) == 1
    assert cloud.registry.preempted() == {} and cloud.metrics.totals["Reruns"] == 1


def test_lost_spot_rank_is_torn_down_and_rerun(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "pair", SPEC + "spot: true\nnum_nodes: 2\n")
    beat(cloud, record)
    reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                    policy=cloud.registry.policy())  # -> RUNNING
    cloud.ec2.terminate_instances(InstanceIds=[record.instances[1]])

    (lost,) = reconcile.sweep(cloud.registry, cloud.compute, now=later(3), metrics=cloud.metrics,
                              policy=cloud.registry.policy())
    assert lost.action.rule == Rule.LOST_SPOT and lost.result == "applied"
    assert cloud.registry.job("pair").state == State.PREEMPTED and not alive(cloud, record.instances[:1])
    assert list(cloud.registry.preempted()) == ["pair"]
    assert reconcile.sweep(cloud.registry, cloud.compute, now=later(4), metrics=cloud.metrics,
                           policy=cloud.registry.policy()) == [], \
        "a PREEMPTED job with its marker is rerun's: the sweep leaves it (and its marker) alone"

    (rerun,) = reconcile.rerun(cloud.registry, cloud.compute, now=later(3), metrics=cloud.metrics, jobs=["pair"],
                               policy=cloud.registry.policy())
    assert rerun.result == "applied" and cloud.registry.job("pair").attempt == 2 and cloud.registry.preempted() == {}


def test_boot_timeout_retries_as_a_restart(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "slow")
    (retry,) = reconcile.sweep(cloud.registry, cloud.compute, now=later(16), metrics=cloud.metrics,
                               policy=cloud.registry.policy())
    assert retry.action.rule == Rule.BOOT_RETRY and retry.result == "applied"
    after = cloud.registry.job("slow")
    assert after.attempt == 2 and after.restarts == 1 and after.state == State.LAUNCHING
    assert not alive(cloud, record.instances) and alive(cloud, after.instances)


def test_stalled_job_is_marked_and_terminated(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "quiet", SPEC + "stall_timeout: 5m\n")
    beat(cloud, record)
    reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                    policy=cloud.registry.policy())  # -> RUNNING + limits
    (stalled,) = reconcile.sweep(cloud.registry, cloud.compute, now=later(6), metrics=cloud.metrics,
                                 policy=cloud.registry.policy())
    assert stalled.action.rule == Rule.STALLED and cloud.registry.job("quiet").state == State.STALLED
    assert not alive(cloud, record.instances) and cloud.metrics.totals["Stalls"] == 1


def test_uptime_cap_stops_then_times_out(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "long", SPEC + "max_runtime: 1h\n")
    beat(cloud, record)
    reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics, policy=cloud.registry.policy())
    (stop,) = reconcile.uptime_cap(cloud.registry, cloud.compute, now=later(55), metrics=cloud.metrics,
                                   policy=cloud.registry.policy())
    assert stop.action.rule == Rule.STOP and cloud.registry.get_json(keys.stop_request("long"))["by"] == "uptime-cap"
    (cap,) = reconcile.uptime_cap(cloud.registry, cloud.compute, now=later(61), metrics=cloud.metrics,
                                  policy=cloud.registry.policy())
    final = cloud.registry.job("long")
    assert cap.result == "applied" and final.state == State.TIMED_OUT and final.reason == "uptime cap 1h reached"
    assert not alive(cloud, record.instances) and cloud.metrics.totals["Timeouts"] == 1
    history = {e["kind"]: e for e in cloud.registry.events("long")}
    assert (history["stop-requested"]["by"], history["stop-requested"]["rule"]) == ("uptime-cap", Rule.STOP)
    assert (history["terminated"]["instances"], history["terminated"]["rule"]) == (record.instances, Rule.TIMED_OUT)


def test_a_stop_on_match_stops_the_peers_then_fails_the_job_without_a_rerun(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "nan", SPEC + "num_nodes: 2\nspot: true\nstop_on: {nan: true}\n")
    beat(cloud, record)
    reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                    policy=cloud.registry.policy())  # -> RUNNING
    why = 'loss became nan at step 40: "step 40 loss nan"'
    report_exit(cloud, record, 0, reason="early-stop", error=why)
    (ask,) = reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics, jobs=["nan"],
                             policy=cloud.registry.policy())
    assert ask.action.rule == Rule.STOP_PEERS and ask.result == "applied"
    assert cloud.registry.get_json(keys.stop_request("nan"))["by"] == "sweeper"
    assert cloud.registry.job("nan").state == State.RUNNING and alive(cloud, record.instances)

    report_exit(cloud, record, 143, rank=1, reason="stopped")
    (failed,) = reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics, jobs=["nan"],
                                policy=cloud.registry.policy())
    final = cloud.registry.job("nan")
    assert failed.action.rule == Rule.EARLY_STOP and final.state == State.FAILED and final.attempt == 1
    assert final.reason == f"stopped: {why} (rank 0)" and final.exit_code == 0
    assert not alive(cloud, record.instances) and cloud.registry.preempted() == {}
    assert reconcile.rerun(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                           policy=cloud.registry.policy()) == []


def test_a_failed_rank_ends_a_multi_node_attempt_at_once(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "ddp", SPEC + "num_nodes: 3\n")
    beat(cloud, record)
    reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics,
                    policy=cloud.registry.policy())  # -> RUNNING
    report_exit(cloud, record, 1, rank=2, error="CUDA error: out of memory")
    (failed,) = reconcile.sweep(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics, jobs=["ddp"],
                                policy=cloud.registry.policy())
    final = cloud.registry.job("ddp")
    assert failed.action.rule == Rule.RANK_FAILED and failed.result == "applied", failed
    assert final.state == State.FAILED and final.exit_code == 1
    assert final.reason == ("rank 2 exited with code 1: CUDA error: out of memory; ending the attempt (terminating "
                            "rank 0, 1)")
    assert not alive(cloud, record.instances), "ranks 0 and 1 would wait in their next collective"


def test_spot_warning_recorded_once(cloud: Cloud) -> None:  # noqa: F811
    record = launch(cloud, "warned", SPEC + "spot: true\n")
    iid = record.instances[0]
    detail = {"instance-id": iid, "instance-action": "terminate"}
    assert reconcile.record_spot_warning(cloud.registry, cloud.compute, iid, now=utcnow(), detail=detail) == "recorded"
    assert reconcile.record_spot_warning(cloud.registry, cloud.compute, iid, now=utcnow(), detail=detail) == "duplicate"
    assert reconcile.record_spot_warning(cloud.registry, cloud.compute, "i-nope", now=utcnow()) == "ignored"
    (notice,) = cloud.registry.job("warned").notices
    assert notice["instance_id"] == iid and notice["action"] == "terminate" and notice["attempt"] == 1
    assert any(e["kind"] == "spot-warning" for e in cloud.registry.events("warned"))


def test_a_vm_whose_agent_never_started_leaves_its_console_output_in_the_logs(
        cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """GetConsoleOutput (moto serving what the instance printed) is read before the VM is terminated."""
    monkeypatch.setenv(CONSOLES_ENV, str(tmp_path))
    record = launch(cloud, "silent", SPEC + "max_restarts: 0\n")
    (instance_id,) = record.instances
    (tmp_path / instance_id).mkdir()
    (tmp_path / instance_id / "console.log").write_text("jobplane-bootstrap: FAILED: no python3 on this image\n")
    (failed,) = reconcile.sweep(cloud.registry, cloud.compute, now=later(16), metrics=cloud.metrics,
                                policy=cloud.registry.policy())
    assert failed.action.rule == Rule.BOOT_FAILED and failed.result == "applied"
    assert "`jobplane logs silent --attempt 1`" in cloud.registry.job("silent").reason
    saved = cloud.registry.get_bytes(keys.console_log("silent", 1, 0)).decode()
    header = f"---- console output of {instance_id} (rank 0, attempt 1), saved by the sweeper ----"
    assert saved.splitlines() == [header, "jobplane-bootstrap: FAILED: no python3 on this image"]
    assert not alive(cloud, [instance_id])
