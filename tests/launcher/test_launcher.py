"""The launcher end to end on moto (S3 + EC2 in-process): drops, capacity fallback, waits, rejections,
quotas, duplicates, redelivery and the backstop. Only EC2's capacity answers are injected."""

from __future__ import annotations

import base64
import json
import threading
from datetime import timedelta

import pytest

from jobplane import keys, launcher
from jobplane.decide import launch as launch_decide
from jobplane.records import ClusterFile, IdleWatch
from jobplane.registry import TransitionRefused, utcnow
from jobplane.spec import parse_spec
from jobplane.states import State
from tests.launcher.conftest import Cloud

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


def drop_and_handle(cloud: Cloud, job_id: str, text: str = SPEC, ext: str = "yaml",
                    owner: str = "alice") -> launcher.Result:
    key = cloud.drop(job_id, text, ext, owner)
    return launcher.handle_drop(cloud.registry, cloud.compute, key, now=utcnow(), metrics=cloud.metrics).result


def queue_keys(cloud: Cloud) -> list[str]:
    return [k for k, _, _ in cloud.registry.listing(keys.QUEUE)]


def tried(cloud: Cloud) -> list[tuple[str, str | None]]:
    return [(c["InstanceType"], c.get("Placement.AvailabilityZone")) for c in cloud.calls.run_instances]


def test_candidates_follow_spec_order() -> None:
    spec = parse_spec(SPEC)
    assert launch_decide.candidates(spec) == [("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b"),
                                         ("g5.2xlarge", "us-east-1a"), ("g5.2xlarge", "us-east-1b")]
    assert launch_decide.candidates(parse_spec("instance_type: t3.micro\nrun: x\n")) == [("t3.micro", None)]


def test_valid_drop_launches_attempt_one(cloud: Cloud) -> None:
    assert drop_and_handle(cloud, "train-1") == "launched"

    record = cloud.registry.job("train-1")
    assert record.state == State.LAUNCHING and record.attempt == 1 and record.restarts == 0
    assert record.instance_type == "g5.xlarge" and record.zone == "us-east-1a" and record.launched_at
    assert queue_keys(cloud) == []
    assert len(cloud.calls.run_instances) == 1
    running = {i["InstanceId"]: i for i in cloud.instances()}
    assert set(record.instances) == set(running)
    cluster = ClusterFile.parse(cloud.registry.get_bytes(keys.cluster("train-1", 1)))
    ips = [running[i]["PrivateIpAddress"] for i in record.instances]
    assert cluster == ClusterFile(job_id="train-1", attempt=1, hosts=ips, instances=record.instances,
                                  master_addr=ips[0], master_port=29500, num_nodes=2, instance_type="g5.xlarge",
                                  zone="us-east-1a", idle_gpu=IdleWatch(window=1800, threshold=5.0))  # the policy's
    user_data = base64.b64decode(cloud.calls.run_instances[0]["UserData"]).decode()  # botocore encodes it
    assert "python train.py" not in user_data and "export JOBPLANE_JOB_ID=train-1" in user_data
    assert "shutdown -h +1440" in user_data  # the policy's default 24 h cap
    assert [k for k, _, _ in cloud.registry.listing(keys.active_prefix("train-1"))] == ["active/train-1/LAUNCHING.1"]
    assert cloud.metrics.totals["JobsLaunched"] == 1


def test_capacity_errors_fall_back_in_spec_order(cloud: Cloud) -> None:
    cloud.calls.no_capacity |= {("g5.xlarge", None), ("g5.2xlarge", "us-east-1a")}

    assert drop_and_handle(cloud, "fallback") == "launched"

    assert tried(cloud) == [("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b"), ("g5.2xlarge", "us-east-1a"),
                            ("g5.2xlarge", "us-east-1b")]
    record = cloud.registry.job("fallback")
    assert (record.instance_type, record.zone) == ("g5.2xlarge", "us-east-1b")
    assert record.last_error and record.last_error.count("InsufficientInstanceCapacity") == 3
    assert cloud.metrics.totals["LaunchCapacityErrors"] == 3
    assert {i["Placement"]["AvailabilityZone"] for i in cloud.instances()} == {"us-east-1b"}


def test_no_capacity_anywhere_waits_then_backstop_retries_same_attempt(cloud: Cloud) -> None:
    cloud.calls.no_capacity |= {("g5.xlarge", None), ("g5.2xlarge", None)}
    t0 = utcnow()

    assert drop_and_handle(cloud, "waiter") == "waiting"

    record = cloud.registry.job("waiter")
    assert record.state == State.WAITING_CAPACITY and record.attempt == 1 and record.waits == 1
    assert record.wait_until and record.wait_until - t0 >= timedelta(seconds=launch_decide.BACKOFF_BASE_S - 5)
    assert record.last_error and "g5.2xlarge in us-east-1b" in record.last_error
    assert cloud.instances() == [] and len(cloud.calls.run_instances) == 4

    # before wait_until nothing happens; after it, with capacity back, the same attempt launches
    assert launcher.backstop(cloud.registry, cloud.compute, now=utcnow(), metrics=cloud.metrics) == []
    cloud.calls.no_capacity.clear()
    later = record.wait_until + timedelta(seconds=1)
    assert [(r.subject, r.result) for r in launcher.backstop(cloud.registry, cloud.compute, now=later,
                                                            metrics=cloud.metrics)] == [("waiter", "launched")]
    record = cloud.registry.job("waiter")
    assert record.state == State.LAUNCHING and record.attempt == 1 and record.waits == 0


def test_second_wait_backs_off_longer_and_max_wait_fails(cloud: Cloud) -> None:
    cloud.calls.no_capacity.add(("t3.micro", None))
    assert drop_and_handle(cloud, "patient", "instance_type: t3.micro\nrun: x\nmax_wait: 1h\n") == "waiting"
    first = cloud.registry.job("patient")
    now = first.wait_until + timedelta(seconds=1)  # type: ignore[operator]
    launcher.backstop(cloud.registry, cloud.compute, now=now, metrics=cloud.metrics)
    second = cloud.registry.job("patient")
    assert second.waits == 2 and second.wait_until - now >= timedelta(seconds=2 * launch_decide.BACKOFF_BASE_S - 1)  # type: ignore[operator]

    past = first.created_at + timedelta(hours=1, seconds=1)
    (said,) = launcher.backstop(cloud.registry, cloud.compute, now=past, metrics=cloud.metrics)
    assert (said.subject, said.result) == ("patient", launcher.Result.FAILED)
    assert said.detail and said.detail.startswith("no capacity in any zone or instance type within max_wait 1h")
    failed = cloud.registry.job("patient")
    assert failed.state == State.FAILED and "max_wait 1h" in (failed.reason or "")
    assert cloud.instances() == []


def test_launch_rejected_fails_the_job(cloud: Cloud) -> None:
    assert drop_and_handle(cloud, "bad-image", SPEC + "image: ami-0000000000000dead\n") == "failed"
    record = cloud.registry.job("bad-image")
    assert record.state == State.FAILED and "InvalidAMIID" in (record.reason or "")
    assert cloud.instances() == [] and cloud.metrics.totals["JobsFailed"] == 1


def test_unreadable_spec_is_rejected_with_every_error_and_nothing_launched(cloud: Cloud) -> None:
    assert drop_and_handle(cloud, "broken", "instance_type: t3.micro\nnum_nodes: 0\nbogus: 1\n") == "rejected"

    reg = cloud.registry
    assert reg.get_bytes(keys.rejected_spec("broken")) == b"instance_type: t3.micro\nnum_nodes: 0\nbogus: 1\n"
    doc = reg.get_json(keys.rejected_error("broken"))
    assert {e["field"] for e in doc["errors"]} == {"num_nodes", "bogus", "run"}
    assert doc["source_key"] == "queue/alice/broken.yaml" and doc["time"]
    assert not reg.exists("broken") and queue_keys(cloud) == []
    assert cloud.calls.run_instances == [] and cloud.instances() == []
    assert cloud.metrics.totals["JobsRejected"] == 1


def test_policy_violation_records_an_invalid_job(cloud: Cloud) -> None:
    cloud.set_policy(f"allowed_instance_types: ['t3.*']\naws:\n  default_image: {cloud.image}\n")
    assert drop_and_handle(cloud, "too-big") == "invalid"

    record = cloud.registry.job("too-big")
    assert record.state == State.INVALID and "instance_type[0]" in (record.reason or "")
    doc = cloud.registry.get_json(keys.rejected_error("too-big"))
    assert [e["field"] for e in doc["errors"]] == ["instance_type[0]", "instance_type[1]"]
    assert list(cloud.registry.listing(keys.active_prefix("too-big"))) == []
    assert cloud.calls.run_instances == [] and queue_keys(cloud) == []



@pytest.mark.parametrize(("text", "field"), [
    ("cloud: gcp\ninstance_type: n2-standard-4\nzones: [us-central1-a]\nrun: python3 train.py\n", "cloud"),
    ("region: eu-west-1\ninstance_type: t3.micro\nrun: python3 train.py\n", "region"),
    ("zones: [us-east-1a, eu-west-1a]\ninstance_type: t3.micro\nrun: python3 train.py\n", "zones[1]"),
])
def test_a_spec_for_another_cloud_or_region_is_invalid_and_never_launched(cloud: Cloud, text: str,
                                                                          field: str) -> None:
    assert cloud.compute.region == "us-east-1"
    assert drop_and_handle(cloud, "elsewhere", text) == "invalid"

    record = cloud.registry.job("elsewhere")
    assert record.state == State.INVALID and (record.reason or "").startswith(f"{field}: ")
    doc = cloud.registry.get_json(keys.rejected_error("elsewhere"))
    assert [e["field"] for e in doc["errors"]] == [field]
    assert cloud.registry.get_bytes(keys.rejected_spec("elsewhere")) == text.encode()  # kept as dropped
    assert cloud.calls.run_instances == [] and cloud.instances() == [] and queue_keys(cloud) == []

def test_queue_entry_names(cloud: Cloud) -> None:
    as_json = json.dumps({"instance_type": "t3.micro", "run": "x"})
    assert drop_and_handle(cloud, "as-json", as_json, "json") == "launched"
    assert drop_and_handle(cloud, "as-yml", "instance_type: t3.micro\nrun: x\n", "yml") == "launched"
    assert drop_and_handle(cloud, "as-txt", "instance_type: t3.micro\nrun: x\n", "txt") == "rejected"
    assert drop_and_handle(cloud, "Bad_Id", "instance_type: t3.micro\nrun: x\n") == "rejected"
    assert cloud.registry.get_json(keys.rejected_error("Bad_Id"))["errors"][0]["field"] == "id"
    reg, compute, m = cloud.registry, cloud.compute, cloud.metrics
    assert launcher.handle_drop(reg, compute, "jobs/x/job.json", now=utcnow(), metrics=m).result == "ignored"
    assert launcher.handle_drop(reg, compute, "queue/team-a/", now=utcnow(), metrics=m).result == "ignored"  # a folder
    assert len(cloud.calls.run_instances) == 2


def test_duplicate_id_is_rejected_and_existing_job_untouched(cloud: Cloud) -> None:
    assert drop_and_handle(cloud, "taken") == "launched"
    before = cloud.registry.get("taken")

    assert drop_and_handle(cloud, "taken", "instance_type: t3.micro\nrun: other\n") == "duplicate"

    assert cloud.registry.get("taken") == before
    doc = cloud.registry.get_json(keys.rejected_error("taken"))
    assert doc["errors"][0]["field"] == "id" and "already exists" in doc["errors"][0]["message"]
    assert len(cloud.calls.run_instances) == 1 and queue_keys(cloud) == []


def test_redelivery_and_identical_redrop_are_no_ops(cloud: Cloud) -> None:
    key = cloud.drop("again", SPEC, owner="alice")
    reg, compute, m = cloud.registry, cloud.compute, cloud.metrics
    assert launcher.handle_drop(reg, compute, key, now=utcnow(), metrics=m).result == "launched"
    assert launcher.handle_drop(reg, compute, key, now=utcnow(), metrics=m).result == "gone"
    assert drop_and_handle(cloud, "again") == "exists"
    assert len(cloud.calls.run_instances) == 1 and queue_keys(cloud) == []
    assert not any(k.startswith(keys.REJECTED) for k, _, _ in reg.listing(""))


def test_same_event_ten_times_concurrently_gives_one_job_and_one_run_instances(cloud: Cloud) -> None:
    key = cloud.drop("racy", SPEC, owner="alice")
    outcomes: list[launcher.Result] = []
    errors: list[BaseException] = []
    start = threading.Barrier(10)

    def deliver() -> None:
        try:
            start.wait()
            outcomes.append(launcher.handle_drop(cloud.registry, cloud.compute, key, now=utcnow(),
                                                 metrics=cloud.metrics).result)
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
    assert len(cloud.calls.run_instances) == 1
    created = [e for e in cloud.registry.events("racy") if e["kind"] == "created"]
    assert len(created) == 1
    assert len(cloud.instances()) == 2 and queue_keys(cloud) == []


def test_owner_quota_makes_the_job_wait(cloud: Cloud) -> None:
    cloud.set_policy(f"max_active_instances_per_owner: 3\naws:\n  default_image: {cloud.image}\n")
    assert drop_and_handle(cloud, "first") == "launched"  # alice: 2 instances
    assert drop_and_handle(cloud, "second") == "waiting"  # 2 + 2 > 3
    record = cloud.registry.job("second")
    assert record.state == State.WAITING_CAPACITY
    assert "owner 'alice' has 2 active instances" in (record.reason or "") and "quota of 3" in (record.reason or "")
    assert drop_and_handle(cloud, "bobs", SPEC.replace("owner: alice", "owner: bob"), owner="bob") == "launched"
    assert len(cloud.calls.run_instances) == 2


def test_backstop_picks_up_old_queue_entries_only(cloud: Cloud) -> None:
    cloud.drop("late", SPEC, owner="alice")
    cloud.drop("plain", "instance_type: t3.micro\nrun: x\n")
    now = utcnow()
    assert launcher.backstop(cloud.registry, cloud.compute, now=now, metrics=cloud.metrics) == []
    outcomes = launcher.backstop(cloud.registry, cloud.compute, now=now + timedelta(seconds=61), metrics=cloud.metrics)
    assert [(r.subject, r.result) for r in outcomes] == [("queue/alice/late.yaml", "launched"),
                                                         ("queue/plain.yaml", "launched")]
    assert cloud.registry.job("late").owner == "alice" and cloud.registry.job("plain").owner == "default"


def test_launch_attempt_claims_by_cas_and_bumps_attempts(cloud: Cloud) -> None:
    drop_and_handle(cloud, "rerun-me")
    reg, now = cloud.registry, utcnow()
    reg.transition("rerun-me", State.RUNNING, now=now)
    reg.transition("rerun-me", State.PREEMPTED, now=now)
    with pytest.raises(TransitionRefused):
        launcher.launch_attempt(reg, cloud.compute, "rerun-me", now=now, expect={State.PREEMPTED},
                                expect_attempt=5, metrics=cloud.metrics)
    record = launcher.launch_attempt(reg, cloud.compute, "rerun-me", now=now, expect={State.PREEMPTED},
                                     expect_attempt=1, metrics=cloud.metrics, reason="rerun after preemption")
    assert record.state == State.LAUNCHING and record.attempt == 2 and record.restarts == 1
    assert reg.get_json(keys.cluster("rerun-me", 2))["attempt"] == 2
    tags = {t["Key"]: t["Value"] for i in cloud.instances() for t in i["Tags"]
            if i["InstanceId"] == record.instances[0]}
    assert tags["jobplane:attempt"] == "2"
