"""Two deployments side by side in one account (one bucket, two registry roots, one region): each one's
sweep, uptime cap and terminate touch only its own VMs, on moto's EC2 and on the Compute Engine fake.

Before VMs carried the deployment tag, staging's sweep called prod's healthy VM an orphan (its job is not
live in staging's registry) and terminated it at orphan_grace."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from jobplane.clouds.aws import Ec2Compute
from jobplane.clouds.base import TAG_DEPLOYMENT, Compute
from jobplane.clouds.gcp import GceCompute, deployment_label, deployment_prefix, name_prefix
from jobplane.clouds.memory import MemoryStore
from jobplane.clouds.s3 import S3Store
from jobplane.control import launcher, reconcile
from jobplane.decide.model import Rule
from jobplane.decide.rules import LaunchCause
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model.clock import utcnow
from jobplane.model.policy import AwsPlacement
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.settings import Settings
from jobplane.store.registry import Registry
from tests.gcp.conftest import PLACEMENT, PLACEMENT_DOC, PROJECT, REGION
from tests.gcp.fakes import ComputeFake
from tests.helpers import publish_agent_manifest
from tests.moto_aws import BUCKET, MotoAws

pytestmark = pytest.mark.timeout(120)
SPEC = "run: python3 train.py\ninstance_type: {itype}\n"
PROD, STAGING = Settings(bucket=BUCKET, root="prod"), Settings(bucket=BUCKET, root="staging")


def test_a_deployment_is_its_registry() -> None:
    assert PROD.deployment == f"{BUCKET}/prod" and Settings(bucket=BUCKET).deployment == BUCKET
    assert deployment_label("Team.Bucket/Prod") == "team-bucket-prod"
    assert len(deployment_label("b" * 63 + "/" + "r" * 40)) <= 63
    assert deployment_prefix(PROD.deployment) != deployment_prefix(STAGING.deployment)
    assert name_prefix("train", 1, PROD.deployment).startswith(deployment_prefix(PROD.deployment))


def side_by_side(prod: tuple[Registry, Compute], staging: tuple[Registry, Compute], itype: str) -> str:
    """prod runs a job; staging (no jobs) sweeps and caps a day later, then asks to terminate prod's VM."""
    (reg, compute), (other_reg, other) = prod, staging
    reg.create_job("train", parse_spec(SPEC.format(itype=itype), "train"))
    record = launcher.launch_attempt(Context(reg, compute, reg.policy(), CountingMetrics()), "train", now=utcnow(),
                                     expect={State.QUEUED}, expect_attempt=0, cause=LaunchCause.SUBMITTED)
    assert record.state == State.LAUNCHING and len(record.instances) == 1
    vm = record.instances[0]
    assert [i.id for i in compute.list_managed()] == [vm] and other.list_managed() == []

    a_day_later = utcnow() + timedelta(days=1)
    staging = Context(other_reg, other, other_reg.policy(), CountingMetrics())
    outcomes = reconcile.check(staging, now=a_day_later) + reconcile.uptime_cap(staging, now=a_day_later)
    assert outcomes == [], "staging sees nothing of prod's"
    other.terminate([vm])  # a bug handing staging prod's id: the adapter re-checks the tag
    assert [i.id for i in compute.list_managed()] == [vm], "prod's VM is alive"

    # prod's own sweep still does its job: the VM of a job prod no longer runs is its orphan
    reg.update("train", now=utcnow(), instances=[])  # as if its record had lost the VM
    reg.transition("train", State.FAILED, now=utcnow(), reason="test")
    mine = reconcile.check(Context(reg, compute, reg.policy(), CountingMetrics()), now=a_day_later)
    assert [(o.action.rule, o.result) for o in mine] == [(Rule.ORPHAN, "applied")]
    assert [i.id for i in compute.list_managed() if i.state in ("pending", "running")] == []
    return vm


def test_on_ec2_each_deployment_sweeps_only_its_own_vms(moto_aws: MotoAws) -> None:
    regs = []
    for settings in (PROD, STAGING):
        reg = Registry(S3Store(BUCKET, moto_aws.s3), settings.root)
        reg.put("config/policy.yaml", f"aws:\n  default_image: {moto_aws.image}\n".encode())
        publish_agent_manifest(reg, "aws")
        regs.append((reg, Ec2Compute(AwsPlacement(), moto_aws.compute.region, moto_aws.ec2,
                                     deployment=settings.deployment)))
    side_by_side(regs[0], regs[1], "t3.micro")
    tags = {t["Key"]: t["Value"] for i in moto_aws.instances() for t in i["Tags"]}
    assert tags[TAG_DEPLOYMENT] == PROD.deployment


@pytest.fixture
def gce_fake() -> Iterator[ComputeFake]:
    fake = ComputeFake(PROJECT, op_polls=1)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def test_on_compute_engine_each_deployment_sweeps_only_its_own_vms(gce_fake: ComputeFake) -> None:
    store = MemoryStore()
    regs = []
    for settings in (PROD, STAGING):
        reg = Registry(store, settings.root)
        reg.put_json("config/policy.yaml", {"gcp": PLACEMENT_DOC})
        publish_agent_manifest(reg, "gcp")
        regs.append((reg, GceCompute(PROJECT, REGION, placement=PLACEMENT, endpoint=gce_fake.endpoint,
                                     operation_timeout=30, deployment=settings.deployment)))
    vm = side_by_side(regs[0], regs[1], "e2-small\ncloud: gcp")
    assert vm.partition("/")[2].startswith(deployment_prefix(PROD.deployment)), "the name IAM's condition reads"
