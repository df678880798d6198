"""Cancelling a job still in queue/ against the launcher, on moto (S3 + EC2 in-process): every interleaving
of the cancel with the launcher's steps, forced one at a time, then both started together many times."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from jobplane.control import launcher
from jobplane.model import keys
from jobplane.model.admission import AdmissionRecord
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from jobplane.ops import cancels
from tests.moto_aws import MotoAws

pytestmark = pytest.mark.timeout(300)

SPEC = "instance_type: t3.micro\nnum_nodes: 2\nrun: python train.py\n"
GONE = ("shutting-down", "terminated")
TRIALS = 16  # of the race below: a sixth of a CPU second each on moto in-process


def handle(moto_aws: MotoAws, key: str) -> launcher.Result:
    return launcher.handle_drop(moto_aws.context(), key, now=utcnow()).result


def cancel(moto_aws: MotoAws, job_id: str) -> cancels.Cancelled:
    return cancels.cancel(moto_aws.registry, job_id, compute=lambda: moto_aws.compute)


def runs_for(moto_aws: MotoAws, job_id: str) -> list[dict[str, Any]]:
    """RunInstances requests sent for this job (the ClientToken starts with its id and attempt)."""
    return [c for c in moto_aws.calls.run_instances if str(c.get("ClientToken", "")).startswith(f"{job_id}-")]


def instances_of(moto_aws: MotoAws, job_id: str) -> dict[str, str]:
    return {i["InstanceId"]: i["State"]["Name"]
            for i in moto_aws.instances({"Name": "tag:jobplane:job-id", "Values": [job_id]})}


def kinds(moto_aws: MotoAws, job_id: str) -> list[str]:
    """The job's event kinds, sorted (events written with one `now` share a stamp, so their order is open)."""
    return sorted(e["kind"] for e in moto_aws.registry.events(job_id))


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


def test_cancel_before_the_launcher_runs_means_never_launched(moto_aws: MotoAws) -> None:
    key = moto_aws.drop("early", SPEC)
    done = cancel(moto_aws, "early")
    assert done.before_launch and done.record.state == State.CANCELLED
    assert done.record.reason == "cancelled by the user before it started" and not done.started
    assert [k for k, _, _ in moto_aws.registry.listing(keys.QUEUE)] == []

    assert handle(moto_aws, key) == "gone"  # the event for the drop arrives after the cancel
    moto_aws.drop("early", SPEC)  # even a redelivered drop: the record decides, and it is CANCELLED
    assert handle(moto_aws, key) == "exists"
    assert runs_for(moto_aws, "early") == [] and instances_of(moto_aws, "early") == {}
    assert kinds(moto_aws, "early") == ["cancelled", "created"]
    assert moto_aws.registry.job("early").state == State.CANCELLED


def test_cancel_after_the_claim_but_before_run_instances_launches_nothing(moto_aws: MotoAws) -> None:
    key = moto_aws.drop("claimed", SPEC)
    # The launcher admits the attempt after its claim: cancel right before its admission's write, so the cancel
    # finds no reservation to give back and the launcher, finding the job moved on, gives its own back.
    cancelling = once(lambda: cancel(moto_aws, "claimed"))
    moto_aws.s3.meta.events.register("before-parameter-build.s3.PutObject", lambda params, **_: cancelling()
                                     if keys.ADMISSION in params["Key"] else None)
    assert handle(moto_aws, key) == launcher.Result.MOVED_ON
    assert runs_for(moto_aws, "claimed") == [] and instances_of(moto_aws, "claimed") == {}
    record = moto_aws.registry.job("claimed")
    assert record.state == State.CANCELLED and record.attempt == 1
    assert kinds(moto_aws, "claimed") == ["cancelled", "created", "launching"]
    assert AdmissionRecord.parse(moto_aws.registry.get_bytes(keys.admission_owner("default"))).reservations == ()


def test_cancel_during_run_instances_terminates_what_it_launched(moto_aws: MotoAws) -> None:
    key = moto_aws.drop("mid-launch", SPEC)
    moto_aws.ec2.meta.events.register("before-call.ec2.RunInstances",
                                   once(lambda: cancel(moto_aws, "mid-launch")))
    assert handle(moto_aws, key) == launcher.Result.MOVED_ON
    assert len(runs_for(moto_aws, "mid-launch")) == 1
    launched = instances_of(moto_aws, "mid-launch")
    assert len(launched) == 2 and all(state in GONE for state in launched.values()), launched
    assert moto_aws.registry.job("mid-launch").state == State.CANCELLED


def test_cancel_overtaken_by_a_whole_launch_terminates_what_was_launched(moto_aws: MotoAws) -> None:
    key = moto_aws.drop("overtaken", SPEC)
    outcome: list[launcher.Result] = []
    # The cancel saw the job queued; the launcher claims, launches and records before the cancel's first write.
    moto_aws.s3.meta.events.register("before-call.s3.PutObject", once(lambda: outcome.append(handle(moto_aws, key))))
    done = cancel(moto_aws, "overtaken")
    assert outcome == ["launched"]
    launched = instances_of(moto_aws, "overtaken")
    assert len(launched) == 2 and sorted(done.terminated) == sorted(launched)
    assert all(state in GONE for state in launched.values()), launched
    assert done.record.state == State.CANCELLED and not done.started


def test_cancel_of_a_launched_job_before_it_runs_terminates_its_instances_at_once(moto_aws: MotoAws) -> None:
    assert handle(moto_aws, moto_aws.drop("booting", SPEC)) == "launched"
    launched = moto_aws.registry.job("booting").instances
    done = cancel(moto_aws, "booting")
    assert not done.started and sorted(done.terminated) == sorted(launched)
    assert all(state in GONE for state in instances_of(moto_aws, "booting").values())


def test_cancel_of_a_running_job_stops_it_gracefully(moto_aws: MotoAws) -> None:
    assert handle(moto_aws, moto_aws.drop("busy", SPEC)) == "launched"
    moto_aws.registry.transition("busy", State.RUNNING, reason="every rank has sent a heartbeat")
    done = cancel(moto_aws, "busy")
    assert done.started and done.terminated == () and done.record.reason == "cancelled by the user"
    assert set(instances_of(moto_aws, "busy").values()) == {"running"}  # its agents see the stop request
    assert moto_aws.registry.get_json(keys.stop_request("busy"))["by"] == "cli"


def test_cancel_and_launcher_started_together_never_leave_an_instance(moto_aws: MotoAws) -> None:
    """Many trials of a cancel and a launcher invocation started at the same instant from two threads. Each
    interleaving is forced once by the tests above; these trials look for any other."""
    seen: Counter[str] = Counter()
    for trial in range(TRIALS):
        job_id = f"race-{trial}"
        key = moto_aws.drop(job_id, SPEC)
        start = threading.Barrier(2)
        failures: list[BaseException] = []
        threads = [threading.Thread(target=together, args=(start, failures, cancel, moto_aws, job_id)),
                   threading.Thread(target=together, args=(start, failures, handle, moto_aws, key))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), f"trial {trial}: a thread is still running after 60 s"
        assert not failures, f"trial {trial}: {failures!r}"

        record = moto_aws.registry.job(job_id)
        assert record.state == State.CANCELLED, f"trial {trial}: {record.state} ({record.reason})"
        assert [k for k, _, _ in moto_aws.registry.listing(keys.queue_entry(job_id))] == [], f"trial {trial}"
        launched = instances_of(moto_aws, job_id)
        assert all(state in GONE for state in launched.values()), f"trial {trial}: {launched} left running"
        if "launching" not in kinds(moto_aws, job_id):  # the cancel won the claim: nothing was asked of EC2
            assert runs_for(moto_aws, job_id) == [] and launched == {}, f"trial {trial}: launched {launched}"
            seen["cancel claimed first"] += 1
        else:  # the launcher claimed first: what it launched was terminated by it or by the cancel
            seen["launcher claimed first, launched" if launched else "launcher claimed first, saw the cancel"] += 1
    print(f"race outcomes over {TRIALS} trials: {dict(seen)}")
