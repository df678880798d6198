"""GceCompute through the real google-cloud-compute client (REST) against the Compute fake, so every
request is serialized and parsed as it would be against GCE."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobplane.clouds.base import CapacityError, LaunchRejected
from jobplane.clouds.gcp import (
    SHUTDOWN_SCRIPT,
    VM_NAME_PREFIX,
    GceCompute,
    name_prefix,
    request_id,
    shutdown_script,
)
from tests.gcp.conftest import IMAGE, PLACEMENT, PROJECT, REGION
from tests.gcp.fakes import ComputeFake
from tests.gcp.helpers import request

pytestmark = pytest.mark.timeout(120)


def vms(fake: ComputeFake, job_id: str) -> list[dict[str, Any]]:
    return sorted((v for v in fake.instances() if v["labels"].get("jobplane-job-id") == job_id),
                  key=lambda v: v["name"])


def test_single_spot_vm_carries_ownership_scheduling_scripts_and_service_account(
        gce: GceCompute, compute_fake: ComputeFake) -> None:
    [inst] = gce.launch(request())
    [vm] = vms(compute_fake, "train-1")
    assert compute_fake.calls["insert"] == 1 and compute_fake.calls["bulkInsert"] == 0
    assert vm["name"] == "jobplane-train-1-a1-0001" and inst.id == "us-central1-a/jobplane-train-1-a1-0001"
    # the spec's labels never override ownership
    assert vm["labels"] == {"jobplane-managed": "true", "jobplane-job-id": "train-1", "jobplane-attempt": "1",
                            "jobplane-owner": "alice", "jobplane-rank": "0", "team": "vision"}
    assert vm["scheduling"] == {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                "maxRunDuration": {"seconds": "7200"}, "onHostMaintenance": "TERMINATE",
                                "automaticRestart": False}
    metadata = {i["key"]: i["value"] for i in vm["metadata"]["items"]}
    assert metadata["startup-script"] == "#!/bin/bash\necho boot\n"
    assert metadata["shutdown-script"] == SHUTDOWN_SCRIPT
    assert metadata["jobplane-job-id"] == "train-1" and metadata["jobplane-rank"] == "0"
    assert vm["serviceAccounts"] == [{"email": PLACEMENT.service_account,
                                      "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    [disk] = vm["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == IMAGE  # the policy's default image
    assert disk["initializeParams"]["diskSizeGb"] == "200"
    assert vm["networkInterfaces"][0]["subnetwork"] == PLACEMENT.subnetwork
    assert "accessConfigs" not in vm["networkInterfaces"][0]  # no external IP
    assert vm["machineType"].endswith("/zones/us-central1-a/machineTypes/g2-standard-8")
    assert (inst.state, inst.managed, inst.spot, inst.rank, inst.attempt) == ("running", True, True, 0, 1)
    assert inst.private_ip == vm["networkInterfaces"][0]["networkIP"]


def test_multi_node_is_one_zonal_bulk_insert_all_or_nothing_in_rank_order(
        gce: GceCompute, compute_fake: ComputeFake) -> None:
    instances = gce.launch(request(nodes=3, zone="us-central1-b", spot=False))
    assert compute_fake.calls["bulkInsert"] == 1 and compute_fake.calls["insert"] == 0
    assert [i.id for i in instances] == [f"us-central1-b/jobplane-train-1-a1-000{n}" for n in (1, 2, 3)]
    assert [i.rank for i in instances] == [0, 1, 2]
    assert len({i.private_ip for i in instances}) == 3
    assert all(v["scheduling"]["provisioningModel"] == "STANDARD" for v in vms(compute_fake, "train-1"))
    assert all("jobplane-rank" not in v["labels"] for v in vms(compute_fake, "train-1"))


def test_no_zone_is_a_regional_bulk_insert_that_lands_in_one_zone_with_room(
        gce: GceCompute, compute_fake: ComputeFake) -> None:
    compute_fake.fail_zone("us-central1-a")
    instances = gce.launch(request(nodes=2, zone=None))
    assert compute_fake.calls["regionBulkInsert"] == 1
    assert {i.zone for i in instances} == {"us-central1-b"}


def test_same_request_twice_creates_nothing_more(gce: GceCompute, compute_fake: ComputeFake) -> None:
    first = gce.launch(request(nodes=2))
    second = gce.launch(request(nodes=2))
    assert [i.id for i in first] == [i.id for i in second]
    assert compute_fake.calls["bulkInsert"] == 2 and len(compute_fake.instances()) == 2
    assert len({request_id("train-1", 1, "us-central1-a", t) for t in (120.0, 179.9)}) == 1
    assert len({request_id("train-1", a, z, 120.0) for a in (1, 2) for z in ("us-central1-a", "x")}) == 4


def test_a_capacity_retry_of_the_same_attempt_a_minute_later_is_a_new_request(
        compute_fake: ComputeFake) -> None:
    now = [1_000_000.0]
    gce = GceCompute(PROJECT, REGION, placement=PLACEMENT, endpoint=compute_fake.endpoint, clock=lambda: now[0])
    compute_fake.fail_zone("us-central1-a", times=1)
    with pytest.raises(CapacityError):
        gce.launch(request())
    with pytest.raises(CapacityError):  # same minute: GCE answers with the first, failed, operation
        gce.launch(request())
    now[0] += 60  # the launcher's first capacity backoff
    assert [i.id for i in gce.launch(request())] == ["us-central1-a/jobplane-train-1-a1-0001"]
    assert compute_fake.calls["insert"] == 3


def test_a_duplicate_across_the_minute_adopts_the_vms_already_there(
        compute_fake: ComputeFake) -> None:
    now = [1_000_079.0]
    gce = GceCompute(PROJECT, REGION, placement=PLACEMENT, endpoint=compute_fake.endpoint, clock=lambda: now[0])
    first = gce.launch(request(nodes=2))
    now[0] += 2  # a new request id, the same VM names: 409, adopted
    assert [i.id for i in gce.launch(request(nodes=2))] == [i.id for i in first]
    assert len(compute_fake.instances()) == 2


@pytest.mark.parametrize("code", ["ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                                  "QUOTA_EXCEEDED"])
def test_capacity_errors_raise_capacity_error_and_create_nothing(
        gce: GceCompute, compute_fake: ComputeFake, code: str) -> None:
    compute_fake.fail_zone("us-central1-a", code)
    with pytest.raises(CapacityError) as err:
        gce.launch(request(nodes=2))
    assert err.value.code == code
    assert compute_fake.instances() == []


def test_every_zone_out_of_capacity_fails_the_regional_launch(
        gce: GceCompute, compute_fake: ComputeFake) -> None:
    for zone in ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"):
        compute_fake.fail_zone(zone)
    with pytest.raises(CapacityError):
        gce.launch(request(zone=None))


def test_bad_requests_are_rejected_not_retried(gce: GceCompute, compute_fake: ComputeFake) -> None:
    with pytest.raises(LaunchRejected, match="Unknown zone"):
        gce.launch(request(zone="mars-north1-a"))
    assert compute_fake.instances() == []


def test_list_managed_is_filtered_server_side_and_normalized(
        gce: GceCompute, compute_fake: ComputeFake) -> None:
    gce.launch(request(nodes=2))
    compute_fake.add_instance("us-central1-c", "someone-elses-vm", {"team": "web"})
    compute_fake.add_instance("us-central1-c", "stopped-one", {"jobplane-managed": "true"}, status="TERMINATED",
                              created=datetime(2026, 1, 1, tzinfo=UTC))
    listed = {i.id: i for i in gce.list_managed()}
    assert set(listed) == {"us-central1-a/jobplane-train-1-a1-0001", "us-central1-a/jobplane-train-1-a1-0002",
                           "us-central1-c/stopped-one"}
    stopped = listed["us-central1-c/stopped-one"]
    assert (stopped.state, stopped.job_id, stopped.launched_at) == ("stopped", None, datetime(2026, 1, 1, tzinfo=UTC))
    assert compute_fake.calls["aggregatedList"] >= 2


def test_terminate_deletes_only_managed_unprotected_vms(gce: GceCompute, compute_fake: ComputeFake) -> None:
    [inst] = gce.launch(request())
    other = compute_fake.add_instance("us-central1-a", "not-ours", {"team": "web"})
    protected = compute_fake.add_instance("us-central1-a", "keep-me", {"jobplane-managed": "true"},
                                          deletion_protection=True)
    gce.terminate([inst.id, other, protected, "us-central1-a/already-gone"])
    assert sorted(v["name"] for v in compute_fake.instances()) == ["keep-me", "not-ours"]


def test_preemptions_are_found_from_zone_operations(gce: GceCompute, compute_fake: ComputeFake) -> None:
    instances = gce.launch(request(nodes=2))
    before = datetime.now(UTC)
    compute_fake.preempt(instances[1].id)
    [seen] = gce.preempted()
    assert seen.instance_id == instances[1].id and seen.at >= before.replace(microsecond=0)
    assert gce.preempted(since=datetime(2100, 1, 1, tzinfo=UTC)) == []
    assert [i.id for i in gce.list_managed()] == [instances[0].id]  # Spot + DELETE: the VM is gone


def test_max_run_duration_is_enforced_by_the_cloud(compute_fake: ComputeFake, gce: GceCompute) -> None:
    [inst] = gce.launch(request())
    assert compute_fake.expire() == []
    compute_fake.clock = lambda: datetime.now(UTC).replace(year=2100)
    assert compute_fake.expire() == [inst.id]
    assert gce.list_managed() == []


def test_names_fit_gce_limits_for_the_longest_job_ids() -> None:
    long_id = "a" + "b" * 61 + "c"
    prefix = name_prefix(long_id, 12)
    assert len(prefix + "-0001") <= 63 and prefix.endswith("-a12") and prefix.startswith(VM_NAME_PREFIX)
    assert name_prefix(long_id, 12) != name_prefix("a" + "b" * 61 + "d", 12)  # the digest keeps them apart


STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, lambda *_: print("got TERM", flush=True))
print("ready", flush=True)
time.sleep(120)
"""


def test_the_shutdown_script_terms_the_agent_and_waits_a_bounded_time(tmp_path: Path) -> None:
    """An agent that never exits holds the shutdown only for wait_s (the scenario tests cover one that does)."""
    marker = f"jobplane-stubborn-{uuid.uuid4().hex}"  # matches this test's process and nothing else
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN, marker], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        script = tmp_path / "shutdown-script"
        script.write_text(shutdown_script(agent_match=marker, wait_s=1))
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "still running after 1 s" in done.stderr, done.stderr
        assert stubborn.stdout.readline() == "got TERM\n" and stubborn.poll() is None  # TERM, nothing harsher
        script.write_text(shutdown_script(agent_match=f"no-such-agent-{uuid.uuid4().hex}", wait_s=1))
        nothing = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
        assert (nothing.returncode, nothing.stderr) == (0, "")  # no agent: nothing to wait for
    finally:
        stubborn.kill()
        stubborn.wait(timeout=10)
