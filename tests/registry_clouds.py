"""registry_clouds: a registry on each cloud, for what runs over one (the CLI, tests/cli/; the SDK, tests/sdk/),
and the control plane's writes to it. The fixture `registry_cloud` runs a test twice: on moto's S3 (in-process)
with EC2, and on the GCS fake with the Compute Engine fake (loopback servers, the real google-cloud clients),
named by s3:// and gs:// URLs in the environment the CLI and the SDK find a registry by; `reg` is its registry
(a module with a registry of its own defines its own `reg`). A plugin of tests/conftest.py, so no test module
imports a fixture; the registry-less local clouds are tests/local/conftest.py's `cloud`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import boto3
import pytest
from moto import mock_aws

from jobplane.clouds.base import TAG_ATTEMPT, TAG_DEPLOYMENT, TAG_JOB_ID, TAG_MANAGED
from jobplane.clouds.gce_metadata import gce_key
from jobplane.clouds.gcp import deployment_label, name_prefix
from jobplane.clouds.s3 import S3Store
from jobplane.local.fake_compute import FakeComputeServer
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.model import keys
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.store.registry import Registry
from tests.helpers import data_of, wait_for
from tests.moto_aws import MOTO_AMI

BUCKET = "jobplane-cli"
SPEC = "name: demo\ninstance_type: t3.micro\nspot: true\nrun: python3 train.py\n"
GCP_ENV = {"GOOGLE_CLOUD_PROJECT": "jobplane-cli", "JOBPLANE_REGION": "us-central1"}


@dataclass
class RegistryCloud:
    """A registry on one cloud, the environment the CLI finds it by, and VMs made the way the launcher tags them."""

    name: str
    reg: Registry
    env: dict[str, str]
    start_vm: Callable[[str, int], str]  # (job id, attempt) -> instance id
    vms: Callable[[], list[str]]  # ids of the VMs alive

    def spec(self, extra: str = "") -> str:
        """SPEC for this cloud (an e2-small on GCP)."""
        text = SPEC.replace("t3.micro", "e2-small") + "cloud: gcp\n" if self.name == "gcp" else SPEC
        return text + extra


@pytest.fixture(params=["aws", "gcp"])
def registry_cloud(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[RegistryCloud]:
    for name in ("JOBPLANE_CLOUD", "JOBPLANE_ROOT", "JOBPLANE_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "aws":
        env = {"JOBPLANE_BUCKET": f"s3://{BUCKET}", "AWS_REGION": "us-east-1"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with mock_aws():
            s3, ec2 = boto3.client("s3", region_name="us-east-1"), boto3.client("ec2", region_name="us-east-1")
            s3.create_bucket(Bucket=BUCKET)
            ami = MOTO_AMI  # one of moto's own (listing them all costs a second a test)

            def start_ec2(job_id: str, attempt: int) -> str:
                tags = {TAG_MANAGED: "true", TAG_DEPLOYMENT: BUCKET, TAG_JOB_ID: job_id, TAG_ATTEMPT: str(attempt)}
                return str(ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, TagSpecifications=[{
                    "ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
                )["Instances"][0]["InstanceId"])

            def running_ec2() -> list[str]:
                pages = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["running"]}])
                return [i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"]]

            yield RegistryCloud("aws", Registry(S3Store(BUCKET, s3)), env, start_ec2, running_ec2)
        return
    from jobplane.clouds.gcs import GcsStore

    with FakeGcsServer() as gcs, FakeComputeServer(GCP_ENV["GOOGLE_CLOUD_PROJECT"]) as compute:
        gcs.create_bucket(BUCKET)
        env = {"JOBPLANE_BUCKET": f"gs://{BUCKET}", "STORAGE_EMULATOR_HOST": gcs.endpoint,
               "JOBPLANE_COMPUTE_ENDPOINT": compute.endpoint, **GCP_ENV}
        for name, value in env.items():
            monkeypatch.setenv(name, value)

        def start_gce(job_id: str, attempt: int) -> str:
            labels = {gce_key(TAG_MANAGED): "true", gce_key(TAG_DEPLOYMENT): deployment_label(BUCKET),
                      gce_key(TAG_JOB_ID): job_id, gce_key(TAG_ATTEMPT): str(attempt)}
            return compute.add_instance("us-central1-a", f"{name_prefix(job_id, attempt, BUCKET)}-0001", labels)

        def running_gce() -> list[str]:
            return [f"{vm['zone'].rsplit('/', 1)[-1]}/{vm['name']}" for vm in compute.instances()]

        yield RegistryCloud("gcp", Registry(GcsStore(BUCKET)), env, start_gce, running_gce)


@pytest.fixture
def reg(registry_cloud: RegistryCloud) -> Registry:
    return registry_cloud.reg


# ---- what the control plane writes ------------------------------------------------------------------------------
def drop(reg: Registry, job_id: str, text: str = SPEC) -> None:
    reg.store.put(keys.queue_entry(job_id), text.encode(), "application/yaml")


def recorded(cloud: RegistryCloud, job_id: str, **state: object) -> None:
    """The job as the launcher records it: LAUNCHING, attempt 1 on one instance (then these fields)."""
    cloud.reg.create_job(job_id, parse_spec(cloud.spec(), job_id))
    cloud.reg.transition(job_id, State.LAUNCHING, expect=[State.QUEUED], attempt=1, instances=["i-1"])
    if state:
        cloud.reg.update(job_id, **state)


class Driver(threading.Thread):
    """Takes the job from queue/ once it is there, runs it with some output, and ends it as told."""

    def __init__(self, reg: Registry, job_id: str, ending: State | None, after: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.reg, self.job_id, self.ending = reg, job_id, ending
        self.after = after or threading.Event()
        if after is None:
            self.after.set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            job_id = self.job_id
            wait_for(f"{job_id} in queue/", lambda: any(True for _ in self.reg.listing(keys.queue_entry(job_id))), 60)
            wait_for("the CLI to show a first status", self.after.is_set, 60)
            reg = self.reg
            reg.create_job(job_id, parse_spec(reg.get_bytes(keys.queue_entry(job_id)), job_id=job_id))
            reg.transition(job_id, State.LAUNCHING, expect={State.QUEUED}, attempt=1, instances=["i-0abc"])
            reg.delete(keys.queue_entry(job_id))
            reg.transition(job_id, State.RUNNING)
            reg.store.put(keys.log_chunk(data_of(reg, job_id), 1, 0, 0), b"step 1 loss 0.5\n")
            if self.ending is None:
                return
            reg.store.put(keys.log_chunk(data_of(reg, job_id), 1, 0, 1), b"step 2 loss 0.1\n")
            reg.put_json(keys.exit_report(job_id, 1, 0), {"code": 0 if self.ending == State.SUCCEEDED else 1})
            reg.transition(job_id, self.ending, reason="every rank exited" if self.ending == State.SUCCEEDED
                           else "rank 0 exited 1")
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(60)
        assert not self.is_alive(), "the driver did not finish in 60 s"
        assert self.error is None, repr(self.error)
