"""One contract for every Compute: EC2 (moto, in-process), GCE (the Compute fake through the real client) and
MemoryCompute, so scenario tests on the last one rest on the semantics the first two enforce."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobplane.clouds.base import TAG_DEPLOYMENT, TAG_JOB_ID, TAG_MANAGED, CapacityError, Compute, LaunchRequest
from jobplane.clouds.memory import Clock, MemoryCompute

if TYPE_CHECKING:
    from tests.gcp.fakes import ComputeFake

pytestmark = pytest.mark.timeout(120)
OURS, THEIRS = "jobplane-test", "jobplane-test/staging"  # this Compute's deployment, and another in the account


@dataclass
class Backend:
    """A Compute and what its test double does for the cloud: start a VM outside jobplane, run out of capacity
    in a zone, print to a VM's console, and say whether a VM is still up."""

    compute: Compute
    zone: str
    instance_type: str
    image: str
    add: Callable[[str, bool, bool, str], str]  # (job_id, managed, protected, deployment) -> instance id
    exhaust: Callable[[str], None]  # zone
    print_console: Callable[[str, str], None]
    alive: Callable[[str], bool]

    def tag(self, key: str) -> str:
        return key.replace(":", "-") if self.compute.cloud == "gcp" else key


def memory_backend() -> Backend:
    clock = Clock(datetime(2026, 11, 22, 12, 0, tzinfo=UTC))
    compute = MemoryCompute(clock, deployment=OURS)
    return Backend(compute, "us-east-1a", "g5.xlarge", "ami-any",
                   add=lambda job, managed, protected, deployment: compute.add(
                       job, 1, managed=managed, protected=protected, deployment=deployment),
                   exhaust=lambda zone: compute.fail(zone=zone),
                   print_console=compute.set_console,
                   alive=lambda iid: compute.state(iid) in ("pending", "running"))


def aws_backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    from jobplane.local.moto_server import CONSOLES_ENV

    moto = request.getfixturevalue("moto_aws")
    monkeypatch.setenv(CONSOLES_ENV, str(tmp_path))

    def add(job: str, managed: bool, protected: bool, deployment: str) -> str:
        tags = [{"Key": TAG_MANAGED, "Value": str(managed).lower()}, {"Key": TAG_JOB_ID, "Value": job},
                {"Key": TAG_DEPLOYMENT, "Value": deployment}]
        (iid,) = [i["InstanceId"] for i in moto.ec2.run_instances(
            ImageId=moto.image, MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"]]
        if protected:
            moto.ec2.modify_instance_attribute(InstanceId=iid, DisableApiTermination={"Value": True})
        return str(iid)

    def print_console(iid: str, text: str) -> None:
        (tmp_path / iid).mkdir()
        (tmp_path / iid / "console.log").write_text(text)

    def alive(iid: str) -> bool:
        (res,) = moto.ec2.describe_instances(InstanceIds=[iid])["Reservations"]
        return res["Instances"][0]["State"]["Name"] in ("pending", "running")

    return Backend(moto.compute, "us-east-1a", "t3.micro", moto.image, add,
                   exhaust=lambda zone: moto.calls.no_capacity.add(("t3.micro", zone)),
                   print_console=print_console, alive=alive)


def gcp_backend(fake: ComputeFake) -> Backend:
    from jobplane.clouds.gcp import GceCompute, deployment_label
    from tests.gcp.conftest import IMAGE, PLACEMENT, PROJECT, REGION

    gce = GceCompute(PROJECT, REGION, placement=PLACEMENT, endpoint=fake.endpoint, operation_timeout=30,
                     deployment=OURS)
    zone = "us-central1-a"

    def add(job: str, managed: bool, protected: bool, deployment: str) -> str:
        labels = {"jobplane-managed": str(managed).lower(), "jobplane-job-id": job,
                  "jobplane-deployment": deployment_label(deployment)}
        return str(fake.add_instance(zone, f"outside-{len(fake.instances())}", labels, deletion_protection=protected))

    return Backend(gce, zone, "g2-standard-8", IMAGE, add, exhaust=fake.fail_zone, print_console=fake.set_console,
                   alive=lambda iid: fake.status(iid) == "RUNNING")


@pytest.fixture(params=["memory", "aws", "gcp"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    if request.param == "memory":
        yield memory_backend()
    elif request.param == "aws":
        yield aws_backend(request, tmp_path, monkeypatch)
    else:
        from tests.gcp.conftest import PROJECT
        from tests.gcp.fakes import ComputeFake

        fake = ComputeFake(PROJECT, op_polls=1)
        fake.start()
        try:
            yield gcp_backend(fake)
        finally:
            fake.stop()


def launch(b: Backend, *, nodes: int = 2) -> list[str]:
    return [i.id for i in b.compute.launch(request(b.instance_type, b.zone, b.image, nodes, b.tag(TAG_MANAGED)))]


def request(instance_type: str, zone: str, image: str, nodes: int, managed_key: str = TAG_MANAGED) -> LaunchRequest:
    """Attempt 3 of job "train", whose spec's labels try to disown its VMs."""
    return LaunchRequest(job_id="train", attempt=3, num_nodes=nodes, instance_type=instance_type, zone=zone,
                         image=image, spot=False, user_data="#!/bin/bash\necho boot\n", max_runtime=3600, disk_gb=50,
                         owner="alice", labels=((managed_key, "false"), ("team", "vision")))


def test_a_launch_starts_every_node_with_ownership_tags_the_spec_cannot_override(backend: Backend) -> None:
    ids = launch(backend)
    listed = {i.id: i for i in backend.compute.list_managed()}
    assert sorted(listed) == sorted(ids)
    assert [listed[i].rank for i in ids] == [0, 1], "ordered by rank"
    for iid in ids:
        inst = listed[iid]
        assert inst.managed and inst.job_id == "train" and inst.attempt == 3 and inst.zone == backend.zone
        assert dict(inst.tags)[backend.tag(TAG_MANAGED)] == "true" and dict(inst.tags)["team"] == "vision"


def test_terminated_vms_leave_the_managed_listing_and_the_others_stay(backend: Backend) -> None:
    first, second = launch(backend)
    backend.compute.terminate([first])
    assert [i.id for i in backend.compute.list_managed()] == [second]
    assert not backend.alive(first) and backend.alive(second)


def test_unmanaged_and_protected_vms_are_never_listed_or_terminated(backend: Backend) -> None:
    unmanaged = backend.add("ghost", False, False, OURS)
    protected = backend.add("ghost", True, True, OURS)
    assert [i.id for i in backend.compute.list_managed()] == [protected]
    backend.compute.terminate([unmanaged, protected])
    assert backend.alive(unmanaged) and backend.alive(protected)


def test_another_deployments_vms_are_never_listed_or_terminated(backend: Backend) -> None:
    mine, theirs = backend.add("train", True, False, OURS), backend.add("train", True, False, THEIRS)
    assert [i.id for i in backend.compute.list_managed()] == [mine]
    backend.compute.terminate([theirs])
    assert backend.alive(theirs)
    backend.compute.terminate([mine])
    assert not backend.alive(mine)


def test_no_capacity_in_a_zone_raises_and_starts_nothing(backend: Backend) -> None:
    backend.exhaust(backend.zone)
    with pytest.raises(CapacityError):
        launch(backend)
    assert backend.compute.list_managed() == []


def test_console_output_is_what_the_vm_printed(backend: Backend) -> None:
    (iid,) = launch(backend, nodes=1)
    backend.print_console(iid, "jobplane-bootstrap: FAILED: no python3 on this image\n")
    assert "FAILED: no python3 on this image" in backend.compute.console_output(iid)


def test_memory_vms_boot_and_shut_down_as_the_clock_moves() -> None:
    clock = Clock(datetime(2026, 11, 22, 12, 0, tzinfo=UTC))
    compute = MemoryCompute(clock, boot=60, shutdown=30)
    (inst,) = compute.launch(request("g5.xlarge", "us-east-1a", "ami-any", 1))
    iid = inst.id
    assert compute.state(iid) == "pending"
    clock.at("12:01")
    assert compute.state(iid) == "running"
    compute.terminate([iid])
    assert compute.state(iid) == "shutting-down" and compute.list_managed() == []
    clock.advance(30)
    assert compute.state(iid) == "terminated" and compute.instances(job_id="train")[0].state == "terminated"
    with pytest.raises(ValueError, match="backwards"):
        clock.at("12:00")
