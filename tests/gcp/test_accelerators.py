"""GPUs on Compute Engine: a spec's `accelerators` through the unchanged launcher and GceCompute (the real
google-cloud-compute client) to the Compute fake, which holds the requests to GCE's rules for guestAccelerators."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any

import pytest

from jobplane.clouds.base import CapacityError, LaunchRejected
from jobplane.clouds.gcp import ACCELERATOR_UNAVAILABLE, GceCompute
from jobplane.control import launcher
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import images, keys
from jobplane.model.clock import utcnow
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import State
from tests.gcp.conftest import PLACEMENT, PLACEMENT_DOC, PROJECT, GcpCloud
from tests.gcp.fakes import ComputeFake
from tests.gcp.helpers import request

pytestmark = pytest.mark.timeout(120)
GPU_IMAGE = images.resolve("gcp", images.DEFAULT_GPU, "n1-standard-8")  # the accelerator image family
N1 = "run: python3 train.py\ncloud: gcp\ninstance_type: n1-standard-8\nzones: [us-central1-a, us-central1-b]\n"


def submit(cloud: GcpCloud, job_id: str, spec: str) -> JobRecord:
    """The launcher on the drop's event, with a policy that names a GPU image beside the CPU one."""
    policy = {"gcp": {**PLACEMENT_DOC, "default_gpu_image": images.DEFAULT_GPU}}
    cloud.registry.put_json("config/policy.yaml", policy)
    key = keys.queue_entry(job_id)
    cloud.registry.put(key, spec.encode(), "application/yaml")
    launcher.handle_drop(cloud.context(metrics=CountingMetrics()), key, now=utcnow())
    return cloud.registry.job(job_id)


def vms(fake: ComputeFake, job_id: str) -> list[dict[str, Any]]:
    return sorted((v for v in fake.instances() if v["labels"].get("jobplane-job-id") == job_id),
                  key=lambda v: v["name"])


def gpus(vm: dict[str, Any]) -> list[tuple[str, int]]:
    return [(a["acceleratorType"].split("/projects/", 1)[1], int(a["acceleratorCount"]))
            for a in vm.get("guestAccelerators", [])]


def test_an_n1_job_with_a_t4_gets_it_attached_no_live_migration_and_the_gpu_image(cloud: GcpCloud) -> None:
    record = submit(cloud, "vision", N1 + "accelerators: {type: nvidia-tesla-t4, count: 1}\n")
    assert record.state == State.LAUNCHING and cloud.compute_fake.calls["insert"] == 1
    [vm] = vms(cloud.compute_fake, "vision")
    assert gpus(vm) == [(f"{PROJECT}/zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", 1)]
    assert vm["scheduling"]["onHostMaintenance"] == "TERMINATE" and vm["scheduling"]["automaticRestart"] is False
    assert vm["disks"][0]["initializeParams"]["sourceImage"] == GPU_IMAGE
    assert images.resolve("gcp", PLACEMENT.default_image, "n1-standard-8") != GPU_IMAGE


def test_the_short_form_on_a_two_node_job_is_one_bulk_insert_naming_the_type(cloud: GcpCloud) -> None:
    record = submit(cloud, "pair", N1 + "accelerators: T4:2\nnum_nodes: 2\n")
    assert record.state == State.LAUNCHING and cloud.compute_fake.calls["bulkInsert"] == 1
    pair = vms(cloud.compute_fake, "pair")
    assert [gpus(vm) for vm in pair] == [[(f"{PROJECT}/zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", 2)]] * 2
    assert all(vm["disks"][0]["initializeParams"]["sourceImage"] == GPU_IMAGE for vm in pair)


def test_an_n1_job_without_accelerators_gets_none_and_the_cpu_image(cloud: GcpCloud) -> None:
    assert submit(cloud, "plain", N1).state == State.LAUNCHING
    [vm] = vms(cloud.compute_fake, "plain")
    assert "guestAccelerators" not in vm
    assert vm["disks"][0]["initializeParams"]["sourceImage"] == PLACEMENT.default_image


def test_a_zone_without_the_gpu_is_a_capacity_error_and_the_next_zone_is_tried(cloud: GcpCloud) -> None:
    cloud.compute_fake.accelerator_types["us-central1-a"] = frozenset({"nvidia-tesla-t4"})  # no V100 there
    record = submit(cloud, "volta", N1 + "accelerators: V100:1\n")
    assert record.state == State.LAUNCHING and record.zone == "us-central1-b"
    assert ACCELERATOR_UNAVAILABLE in (record.last_error or "") and "us-central1-a" in (record.last_error or "")
    [vm] = vms(cloud.compute_fake, "volta")
    assert gpus(vm) == [(f"{PROJECT}/zones/us-central1-b/acceleratorTypes/nvidia-tesla-v100", 1)]


def test_without_zones_gce_picks_one_that_has_the_gpu(cloud: GcpCloud) -> None:
    for zone in ("us-central1-a", "us-central1-b"):
        cloud.compute_fake.accelerator_types[zone] = frozenset()
    spec = "run: python3 train.py\ncloud: gcp\ninstance_type: n1-standard-8\naccelerators: T4:1\nnum_nodes: 2\n"
    record = submit(cloud, "anywhere", spec)
    assert record.state == State.LAUNCHING and cloud.compute_fake.calls["regionBulkInsert"] == 1
    assert record.zone == "us-central1-c"
    assert [gpus(vm) for vm in vms(cloud.compute_fake, "anywhere")] == [
        [(f"{PROJECT}/zones/us-central1-c/acceleratorTypes/nvidia-tesla-t4", 1)]] * 2


def test_no_zone_with_the_gpu_waits_for_capacity(cloud: GcpCloud) -> None:
    for zone in ("us-central1-a", "us-central1-b"):
        cloud.compute_fake.accelerator_types[zone] = frozenset()
    record = submit(cloud, "nowhere", N1 + "accelerators: P4\n")
    assert record.state == State.WAITING_CAPACITY and vms(cloud.compute_fake, "nowhere") == []
    assert "acceleratorTypes/nvidia-tesla-p4' was not found" in (record.last_error or "")


def test_the_adapter_maps_a_missing_accelerator_type_to_capacity(gce: GceCompute, compute_fake: ComputeFake) -> None:
    compute_fake.accelerator_types["us-central1-a"] = frozenset()
    n1 = replace(request(spot=False), instance_type="n1-standard-4", accelerator=("nvidia-tesla-t4", 1))
    with pytest.raises(CapacityError) as err:
        gce.launch(n1)
    assert err.value.code == ACCELERATOR_UNAVAILABLE and compute_fake.instances() == []
    del compute_fake.accelerator_types["us-central1-a"]
    g2 = replace(request(spot=False), accelerator=("nvidia-tesla-t4", 1))  # g2-standard-8: its L4 comes with it
    with pytest.raises(LaunchRejected):  # a type that takes no guestAccelerators: no other zone would do better
        gce.launch(g2)


def post(fake: ComputeFake, zone: str, body: dict[str, Any]) -> tuple[int, str]:
    req = urllib.request.Request(f"{fake.endpoint}/compute/v1/projects/{PROJECT}/zones/{zone}/instances",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, ""
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["error"]["message"]


@pytest.mark.parametrize(("machine", "scheduling", "accelerator", "refused"), [
    ("n1-standard-4", {}, "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "do not support live migration"),
    ("n1-standard-4", {"onHostMaintenance": "MIGRATE"}, "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
     "do not support live migration"),
    ("e2-standard-4", {"onHostMaintenance": "TERMINATE"}, "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
     "features are not compatible"),
    ("n1-standard-4", {"onHostMaintenance": "TERMINATE"}, "zones/us-central1-b/acceleratorTypes/nvidia-tesla-t4",
     "Invalid value for field 'resource.guestAccelerators[0]'"),
    ("n1-standard-4", {"onHostMaintenance": "TERMINATE"}, "zones/us-central1-a/acceleratorTypes/nvidia-h100-80gb",
     "was not found"),
    ("n1-standard-4", {"onHostMaintenance": "TERMINATE"}, "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
     None),
])
def test_the_fake_holds_guest_accelerators_to_gces_rules(compute_fake: ComputeFake, machine: str,
                                                         scheduling: dict[str, str], accelerator: str,
                                                         refused: str | None) -> None:
    status, message = post(compute_fake, "us-central1-a", {
        "name": "gpu-1", "machineType": f"zones/us-central1-a/machineTypes/{machine}", "scheduling": scheduling,
        "guestAccelerators": [{"acceleratorType": accelerator, "acceleratorCount": 1}]})
    if refused is None:
        assert status == 200 and [vm["name"] for vm in compute_fake.instances()] == ["gpu-1"]
    else:
        assert status == 400 and refused in message and compute_fake.instances() == []
