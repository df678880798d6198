"""What the GCP tests do to a deployment on the fakes as its callers would: the functions' events (Eventarc's
object finalized, Cloud Scheduler's call), a drop in queue/, the agents' writes; and a launch request for the
adapter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from functions_framework import create_app

from jobplane.clouds.base import LaunchRequest
from jobplane.model import keys, records
from jobplane.model.clock import utcnow
from jobplane.model.jobrecord import JobRecord
from tests.gcp.conftest import BUCKET, IMAGE, GcpCloud

# the functions' source; a job on two zones, and a Spot job on one (what drop() drops unless told)
MAIN = str(Path(__file__).parents[2] / "functions" / "gcp" / "main.py")
SPEC = "run: python3 train.py\ninstance_type: n2-standard-4\ncloud: gcp\nzones: [us-central1-a, us-central1-b]\n"
SPOT_SPEC = "run: python3 train.py\ninstance_type: n2-standard-4\ncloud: gcp\nzones: [us-central1-a]\nspot: true\n"


def finalized(name: str, bucket: str = BUCKET) -> dict[str, Any]:
    """A binary-mode CloudEvent as Eventarc delivers google.cloud.storage.object.v1.finalized."""
    return {
        "headers": {"ce-id": "1234", "ce-specversion": "1.0",
                    "ce-source": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
                    "ce-type": "google.cloud.storage.object.v1.finalized", "ce-subject": f"objects/{name}",
                    "Content-Type": "application/json"},
        "data": json.dumps({"bucket": bucket, "name": name, "generation": "1"}),
    }


def drop(cloud: GcpCloud, job_id: str, spec: str = SPOT_SPEC) -> str:
    """A spec dropped in queue/ (a Spot job on one zone unless told); returns the object name its event carries."""
    key = keys.queue_entry(job_id)
    cloud.registry.store.put(cloud.registry.key(key), spec.encode(), "application/yaml")
    return "reg/" + key


def call(target: str) -> dict[str, Any]:
    response = create_app(target, MAIN, "http").test_client().post("/")
    assert response.status_code == 200, response.data
    body: dict[str, Any] = response.get_json()
    return body


def beat(cloud: GcpCloud, record: JobRecord) -> None:
    """What a healthy agent writes: a heartbeat per rank and an output mark."""
    for rank in range(record.spec.num_nodes):
        cloud.registry.put_json(keys.heartbeat(record.id, record.attempt, rank), {"time": utcnow().isoformat()})
        cloud.registry.put_json(keys.output_mark(record.id, record.attempt, rank), {"time": utcnow().isoformat()})


def exit_report(cloud: GcpCloud, record: JobRecord, code: int, rank: int = 0) -> None:
    """What the agent does at the end: the exit report, then power-off (GCE keeps the VM, TERMINATED)."""
    now = utcnow()
    cloud.registry.put_json(keys.exit_report(record.id, record.attempt, rank), records.ExitReport(
        code=code, started_at=now, ended_at=now, instance_id=record.instances[rank]).body())
    cloud.compute_fake.power_off(record.instances[rank])


def request(job_id: str = "train-1", *, nodes: int = 1, zone: str | None = "us-central1-a", spot: bool = True,
            attempt: int = 1, image: str = IMAGE) -> LaunchRequest:
    return LaunchRequest(job_id=job_id, attempt=attempt, num_nodes=nodes, instance_type="g2-standard-8",
                         zone=zone, image=image, spot=spot, user_data="#!/bin/bash\necho boot\n",
                         max_runtime=7200, disk_gb=200, owner="alice",
                         labels=(("team", "vision"), ("jobplane-managed", "false")))
