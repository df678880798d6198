"""Cancelling a job still in queue/ against the launcher, on moto (S3 + EC2 in-process): every interleaving
of the cancel with the launcher's steps, forced one at a time, then both started together many times."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from jobplane import jobs, keys, launcher
from jobplane.registry import utcnow
from jobplane.states import State
from tests.launcher.conftest import Cloud

pytestmark = pytest.mark.timeout(300)

SPEC = "instance_type: t3.micro\nnum_nodes: 2\nrun: python train.py\n"
GONE = ("shutting-down", "terminated")


def handle(cloud: Cloud, key: str) -> launcher.Result:
    return launcher.handle_drop(cloud.registry, cloud.compute, key, now=utcnow(), metrics=cloud.metrics).result


def cancel(cloud: Cloud, job_id: str) -> jobs.Cancelled:
    return jobs.cancel(cloud.registry, job_id, compute=lambda: cloud.compute)


def runs_for(cloud: Cloud, job_id: str) -> list[dict[str, Any]]:
    """RunInstances requests sent for this job (the ClientToken starts with its id and attempt)."""
    return [c for c in cloud.calls.run_instances if str(c.get("ClientToken", "")).startswith(f"{job_id}-")]


def instances_of(cloud: Cloud, job_id: str) -> dict[str, str]:
    return {i["InstanceId"]: i["State"]["Name"]
            for i in cloud.instances({"Name": "tag:jobplane:job-id", "Values": [job_id]})}


def kinds(cloud: Cloud, job_id: str) -> list[str]:
    """The job's event kinds, sorted (events written with one `now` share a stamp, so their order is open)."""
    return sorted(e["kind"] for e in cloud.registry.events(job_id))


def once(action: Any) -> Any:
    """A botocore before-call hook that runs action the first time it fires, then lets calls through."""
    fired: list[bool] = []

    def hook(**_: Any) -> None:
        if not fired:
            fired.append(True)
            action()
    return hook


def together(start: threading.Barrier, failures: list[BaseException], fn: Any, *args: Any) -> None:
    """fn(*args) once every thread of the trial is ready; a failure is kept for the trial to report."""
    try:
        start.wait(30)
        fn(*args)
    except BaseException as exc:
        failures.append(exc)


def test_cancel_before_the_launcher_runs_means_never_launched(cloud: Cloud) -> None:
    key = cloud.drop("early", SPEC)
    done = cancel(cloud, "early")
    assert done.before_launch and done.record.state == State.CANCELLED
    assert done.record.reason == "cancelled by the user before it started" and not done.started
    assert [k for k, _, _ in cloud.registry.listing(keys.QUEUE)] == []

    assert handle(cloud, key) == "gone"  # the event for the drop arrives after the cancel
    cloud.drop("early", SPEC)  # even a redelivered drop: the record decides, and it is CANCELLED
    assert handle(cloud, key) == "exists"
    assert runs_for(cloud, "early") == [] and instances_of(cloud, "early") == {}
    assert kinds(cloud, "early") == ["cancelled", "created"]
    assert cloud.registry.job("early").state == State.CANCELLED


def test_cancel_after_the_claim_but_before_run_instances_launches_nothing(cloud: Cloud) -> None:
    key = cloud.drop("claimed", SPEC)
    # The launcher's quota check lists instances after its claim: cancel right then.
    cloud.ec2.meta.events.register("before-call.ec2.DescribeInstances",
                                   once(lambda: cancel(cloud, "claimed")))
    assert handle(cloud, key) == launcher.Result.MOVED_ON
    assert runs_for(cloud, "claimed") == [] and instances_of(cloud, "claimed") == {}
    record = cloud.registry.job("claimed")
    assert record.state == State.CANCELLED and record.attempt == 1
    assert kinds(cloud, "claimed") == ["cancelled", "created", "launching"]


def test_cancel_during_run_instances_terminates_what_it_launched(cloud: Cloud) -> None:
    key = cloud.drop("mid-launch", SPEC)
    cloud.ec2.meta.events.register("before-call.ec2.RunInstances",
                                   once(lambda: cancel(cloud, "mid-launch")))
    assert handle(cloud, key) == launcher.Result.MOVED_ON
    assert len(runs_for(cloud, "mid-launch")) == 1
    launched = instances_of(cloud, "mid-launch")
    assert len(launched) == 2 and all(state in GONE for state in launched.values()), launched
    assert cloud.registry.job("mid-launch").state == State.CANCELLED


def test_cancel_overtaken_by_a_whole_launch_terminates_what_was_launched(cloud: Cloud) -> None:
    key = cloud.drop("overtaken", SPEC)
    outcome: list[launcher.Result] = []
    # The cancel saw the job queued; the launcher claims, launches and records before the cancel's first write.
    cloud.s3.meta.events.register("before-call.s3.PutObject", once(lambda: outcome.append(handle(cloud, key))))
    done = cancel(cloud, "overtaken")
    assert outcome == ["launched"]
    launched = instances_of(cloud, "overtaken")
    assert len(launched) == 2 and sorted(done.terminated) == sorted(launched)
    assert all(state in GONE for state in launched.values()), launched
    assert done.record.state == State.CANCELLED and not done.started


def test_cancel_of_a_launched_job_before_it_runs_terminates_its_instances_at_once(cloud: Cloud) -> None:
    assert handle(cloud, cloud.drop("booting", SPEC)) == "launched"
    launched = cloud.registry.job("booting").instances
    done = cancel(cloud, "booting")
    assert not done.started and sorted(done.terminated) == sorted(launched)
    assert all(state in GONE for state in instances_of(cloud, "booting").values())


def test_cancel_of_a_running_job_stops_it_gracefully(cloud: Cloud) -> None:
    assert handle(cloud, cloud.drop("busy", SPEC)) == "launched"
    cloud.registry.transition("busy", State.RUNNING, reason="every rank has sent a heartbeat")
    done = cancel(cloud, "busy")
    assert done.started and done.terminated == () and done.record.reason == "cancelled by the user"
    assert set(instances_of(cloud, "busy").values()) == {"running"}  # its agents see the stop request
    assert cloud.registry.get_json(keys.stop_request("busy"))["by"] == "cli"


def test_cancel_and_launcher_started_together_never_leave_an_instance(cloud: Cloud) -> None:
    """Many trials of a cancel and a launcher invocation started at the same instant from two threads."""
    seen: Counter[str] = Counter()
    for trial in range(40):
        job_id = f"race-{trial}"
        key = cloud.drop(job_id, SPEC)
        start = threading.Barrier(2)
        failures: list[BaseException] = []
        threads = [threading.Thread(target=together, args=(start, failures, cancel, cloud, job_id)),
                   threading.Thread(target=together, args=(start, failures, handle, cloud, key))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), f"trial {trial}: a thread is still running after 60 s"
        assert not failures, f"trial {trial}: {failures!r}"

        record = cloud.registry.job(job_id)
        assert record.state == State.CANCELLED, f"trial {trial}: {record.state} ({record.reason})"
        assert [k for k, _, _ in cloud.registry.listing(keys.queue_entry(job_id))] == [], f"trial {trial}"
        launched = instances_of(cloud, job_id)
        assert all(state in GONE for state in launched.values()), f"trial {trial}: {launched} left running"
        if "launching" not in kinds(cloud, job_id):  # the cancel won the claim: nothing was asked of EC2
            assert runs_for(cloud, job_id) == [] and launched == {}, f"trial {trial}: launched {launched}"
            seen["cancel claimed first"] += 1
        else:  # the launcher claimed first: what it launched was terminated by it or by the cancel
            seen["launcher claimed first, launched" if launched else "launcher claimed first, saw the cancel"] += 1
    print(f"race outcomes over 40 trials: {dict(seen)}")
