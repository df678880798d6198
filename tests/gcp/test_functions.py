"""functions/gcp/main.py through functions-framework's own test client, over the GCS and Compute fakes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from functions_framework import create_app

from jobplane.clouds.gcp import AGENT_MATCH, SHUTDOWN_SCRIPT, deployment_label, name_prefix
from jobplane.model import keys
from jobplane.model.states import State
from tests.gcp.conftest import BUCKET, DEPLOYMENT, GcpCloud
from tests.gcp.helpers import MAIN, SPOT_SPEC, drop, finalized

pytestmark = pytest.mark.timeout(120)


def test_a_queue_drop_launches_the_job_once_even_when_delivered_twice(cloud: GcpCloud) -> None:
    client = create_app("launcher", MAIN, "cloudevent").test_client()
    name = drop(cloud, "fn-job")
    for _ in range(2):  # Eventarc delivers at least once
        assert client.post("/", **finalized(name)).status_code == 200
    record = cloud.registry.job("fn-job")
    assert record.state == State.LAUNCHING and record.attempt == 1
    name = f"{name_prefix('fn-job', 1, DEPLOYMENT)}-0001"  # jobplane-<deployment hash>-fn-job-a1-0001
    assert [v["name"] for v in cloud.compute_fake.instances()] == [name]
    cluster = cloud.registry.get_json(keys.cluster("fn-job", 1))
    assert cluster["instances"] == [f"us-central1-a/{name}"] and cluster["zone"] == "us-central1-a"
    startup = {i["key"]: i["value"] for i in cloud.compute_fake.instances()[0]["metadata"]["items"]}
    script = startup["startup-script"]
    assert "JOBPLANE_CLOUD=gcp" in script and '"auth":"gce"' in script  # the VM's token, not signed URLs
    assert f"/storage/v1/b/{BUCKET}/o/reg%2Fsystem%2Fagent%2Fgcp-py3.12-x86_64.tar.gz?alt=media" in script
    # the shutdown script finds the agent the startup script starts
    [agent] = [line for line in startup["startup-script"].splitlines() if line.startswith("exec ")]
    assert re.search(AGENT_MATCH, agent) and startup["shutdown-script"] == SHUTDOWN_SCRIPT


@pytest.mark.parametrize("name", ["reg/heartbeats/j/1/0", "reg/jobs/j/job.json", "queue/outside-root.yaml"])
def test_other_objects_are_ignored_without_touching_compute(cloud: GcpCloud, name: str) -> None:
    client = create_app("launcher", MAIN, "cloudevent").test_client()
    assert client.post("/", **finalized(name)).status_code == 200
    assert client.post("/", **finalized("reg/queue/x.yaml", bucket="another-bucket")).status_code == 200
    assert sum(cloud.compute_fake.calls.values()) == 0


def test_an_exit_report_gets_a_targeted_sweep_at_once(cloud: GcpCloud) -> None:
    client = create_app("launcher", MAIN, "cloudevent").test_client()
    assert client.post("/", **finalized(drop(cloud, "done-job"))).status_code == 200
    report = keys.exit_report("done-job", 1, 0)
    (vm,) = cloud.registry.job("done-job").instances
    cloud.registry.put_json(report, {"code": 0, "started_at": "2026-11-22T00:00:00Z",
                                     "ended_at": "2026-11-22T00:01:00Z", "reason": "exit", "instance_id": vm})
    assert client.post("/", **finalized("reg/" + report)).status_code == 200
    final = cloud.registry.job("done-job")
    assert final.state == State.SUCCEEDED and final.exit_code == 0
    assert cloud.compute_fake.instances() == []  # the finishing sweep deleted the job's VM


def test_an_invalid_drop_is_rejected_with_its_reason(cloud: GcpCloud) -> None:
    client = create_app("launcher", MAIN, "cloudevent").test_client()
    name = drop(cloud, "bad-job", "run: x\ninstance_type: n2-standard-4\nnum_nodes: 0\n")
    assert client.post("/", **finalized(name)).status_code == 200
    error = cloud.registry.get_json(keys.rejected_error("bad-job"))
    assert "num_nodes" in json.dumps(error)
    assert cloud.compute_fake.instances() == []



@pytest.mark.parametrize(("spec", "field"), [
    ("run: x\ninstance_type: t3.micro\n", "cloud"),  # cloud defaults to aws
    (SPOT_SPEC.replace("zones: [us-central1-a]", "region: europe-west4"), "region"),
    (SPOT_SPEC.replace("us-central1-a", "europe-west4-a"), "zones[0]"),
])
def test_a_spec_for_another_cloud_or_region_is_recorded_invalid(cloud: GcpCloud, spec: str, field: str) -> None:
    client = create_app("launcher", MAIN, "cloudevent").test_client()
    assert client.post("/", **finalized(drop(cloud, "elsewhere", spec))).status_code == 200
    record = cloud.registry.job("elsewhere")
    assert record.state == State.INVALID and (record.reason or "").startswith(f"{field}: ")
    error = cloud.registry.get_json(keys.rejected_error("elsewhere"))
    assert [e["field"] for e in error["errors"]] == [field]
    assert sum(cloud.compute_fake.calls.values()) == 0  # not even a listing

def test_scheduled_functions_answer_with_their_actions(cloud: GcpCloud) -> None:
    orphan = cloud.compute_fake.add_instance("us-central1-a", f"{name_prefix('orphan', 1, DEPLOYMENT)}-0001", {
        "jobplane-managed": "true", "jobplane-deployment": deployment_label(DEPLOYMENT), "jobplane-job-id": "nobody",
        "jobplane-attempt": "1"},
        created=cloud.compute_fake.clock().replace(year=2020))
    sweeper = create_app("sweeper", MAIN, "http").test_client()
    dry = sweeper.post("/", json={"dry_run": True})
    assert dry.status_code == 200
    assert [a["result"] for a in dry.get_json()["actions"]] == ["dry-run"]
    assert len(cloud.compute_fake.instances()) == 1  # dry-run applies nothing
    applied = sweeper.post("/")
    assert [a["result"] for a in applied.get_json()["actions"]] == ["applied"], applied.get_json()
    assert orphan not in [f"{v['zone'].rsplit('/', 1)[-1]}/{v['name']}" for v in cloud.compute_fake.instances()]
    for target in ("rerun", "uptime_cap", "launcher_backstop"):
        response = create_app(target, MAIN, "http").test_client().post("/")
        assert response.status_code == 200, (target, response.data)


def test_the_gcp_module_never_imports_boto3() -> None:
    code = ("import sys, functions.gcp.main; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('boto3', 'botocore', 'aws_lambda_powertools')))")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         cwd=Path(MAIN).parents[2], timeout=120, check=True)
    assert out.stdout.strip() == "[]"
    imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    assert "boto3" not in imported and "botocore" not in imported and "functions_framework" in imported
