"""moto_aws: in-process moto (mock_aws) S3 + EC2 with a registry, the EC2 adapter, and a seam that records every
RunInstances call and lets a test refuse some (instance type, zone) pairs the way EC2 does when it has no
capacity; then what the control plane and the agents do on it (a launch, beats, exit reports, the functions'
events). The one in-process moto fixture; tests/conftest.py's moto_server is moto over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from moto import mock_aws

from jobplane.clouds.aws import Ec2Compute
from jobplane.clouds.s3 import S3Store
from jobplane.control import launcher
from jobplane.decide.rules import LaunchCause
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.local import triggers
from jobplane.model import keys, records
from jobplane.model.clock import utcnow
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import AwsPlacement
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.store.registry import Registry
from tests.helpers import publish_agent_manifest

BUCKET = "jobplane-test"
REGION = "us-east-1"
MOTO_AMI = "ami-03cf127a"  # one of the AMIs moto 5.2.5 ships, and the one tests/moto_amis.json gives moto


@dataclass
class Ec2Calls:
    """RunInstances requests as sent (query parameters), and which (type, zone) EC2 should refuse."""

    run_instances: list[dict[str, Any]] = field(default_factory=list)
    no_capacity: set[tuple[str, str | None]] = field(default_factory=set)  # zone None: every zone
    error_code: str = "InsufficientInstanceCapacity"

    def before_call(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        body = dict(params["body"])
        self.run_instances.append(body)
        itype, zone = body.get("InstanceType"), body.get("Placement.AvailabilityZone")
        if (itype, zone) in self.no_capacity or (itype, None) in self.no_capacity:
            error = {"Error": {"Code": self.error_code, "Message": f"no {itype} in {zone}"},
                     "ResponseMetadata": {"HTTPStatusCode": 400}}
            return AWSResponse("https://ec2.us-east-1.amazonaws.com/", 400, {}, None), error
        return None  # the real (moto) call goes ahead


@dataclass
class MotoAws:
    """moto's S3 and EC2 (in-process) with a registry in a bucket, the EC2 adapter, and the RunInstances seam."""

    s3: Any
    ec2: Any
    registry: Registry
    compute: Ec2Compute
    calls: Ec2Calls
    metrics: CountingMetrics
    image: str

    def context(self, metrics: CountingMetrics | None = None, **over: Any) -> Context:
        """A run's context over this registry and adapter, with the policy as it is now (and these metrics)."""
        return Context(self.registry, self.compute, self.registry.policy(), metrics or self.metrics, **over)

    def set_policy(self, text: str) -> None:
        self.s3.put_object(Bucket=BUCKET, Key="config/policy.yaml", Body=text.encode())
        self.compute.placement = self.registry.policy().aws

    def drop(self, job_id: str, text: str, ext: str = "yaml", owner: str = keys.DEFAULT_OWNER) -> str:
        key = keys.queue_entry(job_id, owner, ext)
        self.s3.put_object(Bucket=BUCKET, Key=self.registry.key(key), Body=text.encode())
        return key

    def instances(self, *filters: dict[str, Any]) -> list[dict[str, Any]]:
        pages = self.ec2.get_paginator("describe_instances").paginate(Filters=list(filters))
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


@pytest.fixture
def moto_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoAws]:
    """In-process moto (mock_aws): a bucket with a registry, a policy naming a moto AMI and the agent manifest."""
    monkeypatch.setenv("JOBPLANE_BUCKET", BUCKET)
    monkeypatch.setenv("AWS_REGION", REGION)
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        ec2 = boto3.client("ec2", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        image = ec2.describe_images(ImageIds=[MOTO_AMI])["Images"][0]["ImageId"]
        calls = Ec2Calls()
        ec2.meta.events.register("before-call.ec2.RunInstances", calls.before_call)
        registry = Registry(S3Store(BUCKET, s3))
        cloud = MotoAws(s3, ec2, registry, Ec2Compute(AwsPlacement(), REGION, ec2, deployment=BUCKET), calls,
                        CountingMetrics(), image)  # the deployment the functions see (JOBPLANE_BUCKET)
        cloud.set_policy(f"aws:\n  default_image: {image}\n")
        publish_agent_manifest(registry, "aws")
        yield cloud


# ---- the control plane and its agents on it ---------------------------------------------------------------------
SPEC = "run: python3 train.py\ninstance_type: t3.micro\n"
SCHEDULED = triggers.scheduled("sweeper", REGION)  # the event of the sweeper's schedule


def created(key: str) -> dict[str, Any]:
    """The event of an object created in the registry's bucket."""
    return triggers.object_created(BUCKET, key, 10, REGION)


def launch(c: MotoAws, job_id: str, spec: str = SPEC) -> JobRecord:
    """The job recorded and its first attempt launched, as the launcher does on the drop's event."""
    c.registry.create_job(job_id, parse_spec(spec, job_id))
    return launcher.launch_attempt(c.context(), job_id, now=utcnow(), expect={State.QUEUED}, expect_attempt=0,
                                   cause=LaunchCause.SUBMITTED)


def beat(c: MotoAws, record: JobRecord) -> None:
    """Every rank of the attempt beats, and rank 0's user process printed."""
    for rank in range(record.spec.num_nodes):
        c.registry.put_json(keys.heartbeat(record.id, record.attempt, rank), {"time": utcnow().isoformat()})
    c.registry.put_json(keys.output_mark(record.id, record.attempt, 0), {"time": utcnow().isoformat()})


def report_exit(c: MotoAws, record: JobRecord, code: int, rank: int = 0, **more: Any) -> None:
    """The exit report the agent on that rank's VM writes."""
    c.registry.put_json(keys.exit_report(record.id, record.attempt, rank),
                        records.ExitReport(code=code, instance_id=record.instances[rank], **more).body())
