"""Fixtures for the GCP tests: the real google-cloud-compute client against the Compute fake (REST on
loopback), and GcsStore against the precondition-enforcing GCS fake. Nothing reaches Google."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from jobplane.clouds.gcp import GceCompute
from jobplane.clouds.gcs import GcsStore
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics, Metrics
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.model.policy import policy_from
from jobplane.store.registry import Registry
from tests.gcp.fakes import ComputeFake
from tests.helpers import publish_agent_manifest

PROJECT, REGION, BUCKET = "jobplane-local", "us-central1", "jobplane-gcp-test"
DEPLOYMENT = f"{BUCKET}/reg"  # Settings.deployment of the functions' environment below
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
PLACEMENT_DOC = {"service_account": "vm@jobplane-local.iam.gserviceaccount.com", "default_image": IMAGE,
                 "subnetwork": "regions/us-central1/subnetworks/jobplane"}  # the policy's gcp section
PLACEMENT = policy_from({"gcp": PLACEMENT_DOC}).gcp


@pytest.fixture
def compute_fake() -> Iterator[ComputeFake]:
    fake = ComputeFake(PROJECT, op_polls=1)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def gce(compute_fake: ComputeFake) -> GceCompute:
    return GceCompute(PROJECT, REGION, placement=PLACEMENT, endpoint=compute_fake.endpoint, operation_timeout=30)


@pytest.fixture
def gcs_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGcsServer]:
    fake = FakeGcsServer()
    fake.start()
    fake.create_bucket(BUCKET)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.endpoint)  # anonymous credentials, no real GCS
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    try:
        yield fake
    finally:
        fake.stop()


@dataclass
class GcpCloud:
    compute_fake: ComputeFake
    compute: GceCompute
    gcs_fake: FakeGcsServer
    registry: Registry

    def context(self, metrics: Metrics | None = None, **over: Any) -> Context:
        """A run's context over this registry and adapter, with the policy as it is now."""
        return Context(self.registry, self.compute, self.registry.policy(), metrics or CountingMetrics(), **over)


@pytest.fixture
def cloud(compute_fake: ComputeFake, gcs_fake: FakeGcsServer, monkeypatch: pytest.MonkeyPatch) -> GcpCloud:
    """Registry on GCS (root "reg"), Compute on the fake as the deployment the functions see; the environment
    the functions read."""
    for name, value in {"JOBPLANE_BUCKET": BUCKET, "JOBPLANE_ROOT": "reg", "JOBPLANE_REGION": REGION,
                        "JOBPLANE_CLOUD": "gcp", "JOBPLANE_COMPUTE_ENDPOINT": compute_fake.endpoint}.items():
        monkeypatch.setenv(name, value)
    registry = Registry(GcsStore(BUCKET), "reg")
    registry.put_json("config/policy.yaml", {"gcp": PLACEMENT_DOC})
    publish_agent_manifest(registry, "gcp")
    gce = GceCompute(PROJECT, REGION, placement=PLACEMENT, endpoint=compute_fake.endpoint, operation_timeout=30,
                     deployment=DEPLOYMENT)
    return GcpCloud(compute_fake, gce, gcs_fake, registry)
