"""The launcher end to end on moto (S3 + EC2 in-process): drops, capacity fallback, waits, rejections,
quotas, duplicates, redelivery and the backstop. Only EC2's capacity answers are injected."""

from __future__ import annotations

import base64
import json
import threading
from datetime import timedelta

import pytest

from jobplane.control import launcher
from jobplane.decide import launch as launch_decide
from jobplane.decide.rules import LaunchCause, Rule
from jobplane.deployment.context import Context
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.records import ClusterFile, IdleWatch
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.store.registry import TransitionRefused
from tests.moto_aws import MotoAws

pytestmark = pytest.mark.timeout(120)

SPEC = """
instance_type: [g5.xlarge, g5.2xlarge]
zones: [us-east-1a, us-east-1b]
num_nodes: 2
spot: true
owner: alice
run: python train.py
labels: {team: vision}
"""


def drop_and_handle(moto_aws: MotoAws, job_id: str, text: str = SPEC, ext: str = "yaml",
                    owner: str = "alice") -> launcher.Result:
    key = moto_aws.drop(job_id, text, ext, owner)
    return launcher.handle_drop(moto_aws.context(), key, now=utcnow()).result


def queue_keys(moto_aws: MotoAws) -> list[str]:
    return [k for k, _, _ in moto_aws.registry.listing(keys.QUEUE)]


def tried(moto_aws: MotoAws) -> list[tuple[str, str | None]]:
    return [(c["InstanceType"], c.get("Placement.AvailabilityZone")) for c in moto_aws.calls.run_instances]


def test_candidates_follow_spec_order() -> None:
    spec = parse_spec(SPEC)
    assert launch_decide.candidates(spec) == [("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b"),
                                         ("g5.2xlarge", "us-east-1a"), ("g5.2xlarge", "us-east-1b")]
    assert launch_decide.candidates(parse_spec("instance_type: t3.micro\nrun: x\n")) == [("t3.micro", None)]


def test_valid_drop_launches_attempt_one(moto_aws: MotoAws) -> None:
    assert drop_and_handle(moto_aws, "train-1") == "launched"

    record = moto_aws.registry.job("train-1")
    assert record.state == State.LAUNCHING and record.attempt == 1 and record.restarts == 0
    assert record.instance_type == "g5.xlarge" and record.zone == "us-east-1a" and record.launched_at
    assert queue_keys(moto_aws) == []
    assert len(moto_aws.calls.run_instances) == 1
    running = {i["InstanceId"]: i for i in moto_aws.instances()}
    assert set(record.instances) == set(running)
    cluster = ClusterFile.parse(moto_aws.registry.get_bytes(keys.cluster("train-1", 1)))
    ips = [running[i]["PrivateIpAddress"] for i in record.instances]
    assert cluster == ClusterFile(job_id="train-1", attempt=1, hosts=ips, instances=record.instances,
                                  master_addr=ips[0], master_port=29500, num_nodes=2, instance_type="g5.xlarge",
                                  zone="us-east-1a", idle_gpu=IdleWatch(window=1800, threshold=5.0))  # the policy's
    user_data = base64.b64decode(moto_aws.calls.run_instances[0]["UserData"]).decode()  # botocore encodes it
    assert "python train.py" not in user_data and "export JOBPLANE_JOB_ID=train-1" in user_data
    assert "shutdown -h +1440" in user_data  # the policy's default 24 h cap
    assert [k for k, _, _ in moto_aws.registry.listing(keys.active_prefix("train-1"))] == ["active/train-1/LAUNCHING.1"]
    assert moto_aws.metrics.totals["JobsLaunched"] == 1


def test_capacity_errors_fall_back_in_spec_order(moto_aws: MotoAws) -> None:
    moto_aws.calls.no_capacity |= {("g5.xlarge", None), ("g5.2xlarge", "us-east-1a")}

    assert drop_and_handle(moto_aws, "fallback") == "launched"

    assert tried(moto_aws) == [("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b"), ("g5.2xlarge", "us-east-1a"),
                            ("g5.2xlarge", "us-east-1b")]
    record = moto_aws.registry.job("fallback")
    assert (record.instance_type, record.zone) == ("g5.2xlarge", "us-east-1b")
    assert record.last_error and record.last_error.count("InsufficientInstanceCapacity") == 3
    assert moto_aws.metrics.totals["LaunchCapacityErrors"] == 3
    assert {i["Placement"]["AvailabilityZone"] for i in moto_aws.instances()} == {"us-east-1b"}


def test_no_capacity_anywhere_waits_then_backstop_retries_same_attempt(moto_aws: MotoAws) -> None:
    moto_aws.calls.no_capacity |= {("g5.xlarge", None), ("g5.2xlarge", None)}
    t0 = utcnow()

    assert drop_and_handle(moto_aws, "waiter") == "waiting"

    record = moto_aws.registry.job("waiter")
    assert record.state == State.WAITING_CAPACITY and record.attempt == 1 and record.waits == 1
    assert record.wait_until and record.wait_until - t0 >= timedelta(seconds=launch_decide.BACKOFF_BASE_S - 5)
    assert record.last_error and "g5.2xlarge in us-east-1b" in record.last_error
    assert moto_aws.instances() == [] and len(moto_aws.calls.run_instances) == 4

    # before wait_until nothing happens; after it, with capacity back, the same attempt launches
    assert launcher.backstop(moto_aws.context(), now=utcnow()) == []
    moto_aws.calls.no_capacity.clear()
    later = record.wait_until + timedelta(seconds=1)
    outcomes = launcher.backstop(moto_aws.context(), now=later)
    assert [(r.subject, r.result) for r in outcomes] == [("waiter", "launched")]
    record = moto_aws.registry.job("waiter")
    assert record.state == State.LAUNCHING and record.attempt == 1 and record.waits == 0


def test_second_wait_backs_off_longer_and_max_wait_fails(moto_aws: MotoAws) -> None:
    moto_aws.calls.no_capacity.add(("t3.micro", None))
    assert drop_and_handle(moto_aws, "patient", "instance_type: t3.micro\nrun: x\nmax_wait: 1h\n") == "waiting"
    first = moto_aws.registry.job("patient")
    now = first.wait_until + timedelta(seconds=1)  # type: ignore[operator]
    launcher.backstop(moto_aws.context(), now=now)
    second = moto_aws.registry.job("patient")
    assert second.waits == 2 and second.wait_until - now >= timedelta(seconds=2 * launch_decide.BACKOFF_BASE_S - 1)  # type: ignore[operator]

    past = first.created_at + timedelta(hours=1, seconds=1)
    (said,) = launcher.backstop(moto_aws.context(), now=past)
    assert (said.subject, said.result) == ("patient", launcher.Result.FAILED)
    assert said.detail and said.detail.startswith("no capacity in any zone or instance type within max_wait 1h")
    failed = moto_aws.registry.job("patient")
    assert (failed.state, failed.cause, failed.reason) == (State.FAILED, LaunchCause.MAX_WAIT, said.detail)
    assert moto_aws.instances() == []


def test_launch_rejected_fails_the_job(moto_aws: MotoAws) -> None:
    assert drop_and_handle(moto_aws, "bad-image", SPEC + "image: ami-0000000000000dead\n") == "failed"
    record = moto_aws.registry.job("bad-image")
    assert record.state == State.FAILED and record.cause == LaunchCause.REJECTED
    assert "InvalidAMIID" in (record.reason or ""), "the cloud's own words, for people"
    assert moto_aws.instances() == [] and moto_aws.metrics.totals["JobsFailed"] == 1


def test_unreadable_spec_is_rejected_with_every_error_and_nothing_launched(moto_aws: MotoAws) -> None:
    assert drop_and_handle(moto_aws, "broken", "instance_type: t3.micro\nnum_nodes: 0\nbogus: 1\n") == "rejected"

    reg = moto_aws.registry
    assert reg.get_bytes(keys.rejected_spec("broken")) == b"instance_type: t3.micro\nnum_nodes: 0\nbogus: 1\n"
    doc = reg.get_json(keys.rejected_error("broken"))
    assert {e["field"] for e in doc["errors"]} == {"num_nodes", "bogus", "run"}
    assert doc["source_key"] == "queue/alice/broken.yaml" and doc["time"]
    assert not reg.exists("broken") and queue_keys(moto_aws) == []
    assert moto_aws.calls.run_instances == [] and moto_aws.instances() == []
    assert moto_aws.metrics.totals["JobsRejected"] == 1


def test_policy_violation_records_an_invalid_job(moto_aws: MotoAws) -> None:
    moto_aws.set_policy(f"allowed_instance_types: ['t3.*']\naws:\n  default_image: {moto_aws.image}\n")
    assert drop_and_handle(moto_aws, "too-big") == "invalid"

    record = moto_aws.registry.job("too-big")
    assert record.state == State.INVALID and record.cause == LaunchCause.INVALID
    assert "instance_type[0]" in (record.reason or ""), "the reason names the field, for people"
    doc = moto_aws.registry.get_json(keys.rejected_error("too-big"))
    assert [e["field"] for e in doc["errors"]] == ["instance_type[0]", "instance_type[1]"]
    assert list(moto_aws.registry.listing(keys.active_prefix("too-big"))) == []
    assert moto_aws.calls.run_instances == [] and queue_keys(moto_aws) == []



@pytest.mark.parametrize(("text", "field"), [
    ("cloud: gcp\ninstance_type: n2-standard-4\nzones: [us-central1-a]\nrun: python3 train.py\n", "cloud"),
    ("region: eu-west-1\ninstance_type: t3.micro\nrun: python3 train.py\n", "region"),
    ("zones: [us-east-1a, eu-west-1a]\ninstance_type: t3.micro\nrun: python3 train.py\n", "zones[1]"),
])
def test_a_spec_for_another_cloud_or_region_is_invalid_and_never_launched(moto_aws: MotoAws, text: str,
                                                                          field: str) -> None:
    assert moto_aws.compute.region == "us-east-1"
    assert drop_and_handle(moto_aws, "elsewhere", text) == "invalid"

    record = moto_aws.registry.job("elsewhere")
    assert record.state == State.INVALID and (record.reason or "").startswith(f"{field}: ")
    doc = moto_aws.registry.get_json(keys.rejected_error("elsewhere"))
    assert [e["field"] for e in doc["errors"]] == [field]
    assert moto_aws.registry.get_bytes(keys.rejected_spec("elsewhere")) == text.encode()  # kept as dropped
    assert moto_aws.calls.run_instances == [] and moto_aws.instances() == [] and queue_keys(moto_aws) == []

def test_queue_entry_names(moto_aws: MotoAws) -> None:
    as_json = json.dumps({"instance_type": "t3.micro", "run": "x"})
    assert drop_and_handle(moto_aws, "as-json", as_json, "json") == "launched"
    assert drop_and_handle(moto_aws, "as-yml", "instance_type: t3.micro\nrun: x\n", "yml") == "launched"
    assert drop_and_handle(moto_aws, "as-txt", "instance_type: t3.micro\nrun: x\n", "txt") == "rejected"
    assert drop_and_handle(moto_aws, "Bad_Id", "instance_type: t3.micro\nrun: x\n") == "rejected"
    assert moto_aws.registry.get_json(keys.rejected_error("Bad_Id"))["errors"][0]["field"] == "id"
    reg, compute, m = moto_aws.registry, moto_aws.compute, moto_aws.metrics
    ctx = Context(reg, compute, reg.policy(), m)
    assert launcher.handle_drop(ctx, "jobs/x/job.json", now=utcnow()).result == "ignored"
    assert launcher.handle_drop(ctx, "queue/team-a/", now=utcnow()).result == "ignored"  # a folder
    assert len(moto_aws.calls.run_instances) == 2


def test_duplicate_id_is_rejected_and_existing_job_untouched(moto_aws: MotoAws) -> None:
    assert drop_and_handle(moto_aws, "taken") == "launched"
    before = moto_aws.registry.get("taken")

    assert drop_and_handle(moto_aws, "taken", "instance_type: t3.micro\nrun: other\n") == "duplicate"

    assert moto_aws.registry.get("taken") == before
    doc = moto_aws.registry.get_json(keys.rejected_error("taken"))
    assert doc["errors"][0]["field"] == "id" and "already exists" in doc["errors"][0]["message"]
    assert len(moto_aws.calls.run_instances) == 1 and queue_keys(moto_aws) == []


def test_redelivery_and_identical_redrop_are_no_ops(moto_aws: MotoAws) -> None:
    key = moto_aws.drop("again", SPEC, owner="alice")
    reg, compute, m = moto_aws.registry, moto_aws.compute, moto_aws.metrics
    assert launcher.handle_drop(Context(reg, compute, reg.policy(), m), key, now=utcnow()).result == "launched"
    assert launcher.handle_drop(Context(reg, compute, reg.policy(), m), key, now=utcnow()).result == "gone"
    assert drop_and_handle(moto_aws, "again") == "exists"
    assert len(moto_aws.calls.run_instances) == 1 and queue_keys(moto_aws) == []
    assert not any(k.startswith(keys.REJECTED) for k, _, _ in reg.listing(""))


def test_same_event_ten_times_concurrently_gives_one_job_and_one_run_instances(moto_aws: MotoAws) -> None:
    key = moto_aws.drop("racy", SPEC, owner="alice")
    outcomes: list[launcher.Result] = []
    errors: list[BaseException] = []
    start = threading.Barrier(10)

    def deliver() -> None:
        try:
            start.wait()
            outcomes.append(launcher.handle_drop(moto_aws.context(), key, now=utcnow()).result)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=deliver) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert errors == []
    assert sorted(outcomes).count("launched") == 1 and len(outcomes) == 10
    assert set(outcomes) <= {"launched", "exists", "gone"}
    assert len(moto_aws.calls.run_instances) == 1
    created = [e for e in moto_aws.registry.events("racy") if e["kind"] == "created"]
    assert len(created) == 1
    assert len(moto_aws.instances()) == 2 and queue_keys(moto_aws) == []


def test_owner_quota_makes_the_job_wait(moto_aws: MotoAws) -> None:
    moto_aws.set_policy(f"max_active_instances_per_owner: 3\naws:\n  default_image: {moto_aws.image}\n")
    assert drop_and_handle(moto_aws, "first") == "launched"  # alice: 2 instances
    assert drop_and_handle(moto_aws, "second") == "waiting"  # 2 + 2 > 3
    record = moto_aws.registry.job("second")
    assert (record.state, record.cause) == (State.WAITING_CAPACITY, LaunchCause.OVER_QUOTA)
    assert record.reason == ("owner 'alice' has 2 active instances; 2 more would exceed the quota of 3 "
                             "(max_active_instances_per_owner)")
    assert drop_and_handle(moto_aws, "bobs", SPEC.replace("owner: alice", "owner: bob"), owner="bob") == "launched"
    assert len(moto_aws.calls.run_instances) == 2


def test_backstop_picks_up_old_queue_entries_only(moto_aws: MotoAws) -> None:
    moto_aws.drop("late", SPEC, owner="alice")
    moto_aws.drop("plain", "instance_type: t3.micro\nrun: x\n")
    now = utcnow()
    assert launcher.backstop(moto_aws.context(), now=now) == []
    outcomes = launcher.backstop(moto_aws.context(), now=now + timedelta(seconds=61))
    assert [(r.subject, r.result) for r in outcomes] == [("queue/alice/late.yaml", "launched"),
                                                         ("queue/plain.yaml", "launched")]
    assert moto_aws.registry.job("late").owner == "alice" and moto_aws.registry.job("plain").owner == "default"


def test_launch_attempt_claims_by_cas_and_bumps_attempts(moto_aws: MotoAws) -> None:
    drop_and_handle(moto_aws, "rerun-me")
    reg, now = moto_aws.registry, utcnow()
    reg.transition("rerun-me", State.RUNNING, now=now)
    reg.transition("rerun-me", State.PREEMPTED, now=now)
    with pytest.raises(TransitionRefused):
        launcher.launch_attempt(moto_aws.context(), "rerun-me", now=now, expect={State.PREEMPTED}, expect_attempt=5,
                                cause=Rule.RERUN)
    record = launcher.launch_attempt(moto_aws.context(), "rerun-me", now=now, expect={State.PREEMPTED},
                                     expect_attempt=1, reason="rerun after preemption", cause=Rule.RERUN)
    assert record.state == State.LAUNCHING and record.attempt == 2 and record.restarts == 1
    assert reg.get_json(keys.cluster("rerun-me", 2))["attempt"] == 2
    tags = {t["Key"]: t["Value"] for i in moto_aws.instances() for t in i["Tags"]
            if i["InstanceId"] == record.instances[0]}
    assert tags["jobplane:attempt"] == "2"
