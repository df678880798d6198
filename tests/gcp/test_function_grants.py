"""The local GCP cloud holds its functions to infra/gcp's grants (jobplane.local.module_iam): the Compute fake answers a
call of the functions' token that the module's custom roles, their condition or the act-as binding do not allow
with GCE's 403 naming the permission, and the GCS fake keeps that token to the registry bucket; a token STS
downscopes from it reaches no further. A request without the token (tests, tools) is not checked."""

from __future__ import annotations

import dataclasses

import pytest

from jobplane.clouds.base import AccessDenied, LaunchRequest
from jobplane.clouds.gcp import GceCompute, deployment_prefix
from jobplane.clouds.gcs import GcsStore, access_token_credentials
from jobplane.local import fake_sts, gce_permissions, module_iam
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.local.google_identity import VM_SERVICE_ACCOUNT
from jobplane.local.module_iam import FUNCTIONS_TOKEN
from tests.gcp.conftest import PLACEMENT, PROJECT, REGION
from tests.gcp.fakes import ComputeFake

pytestmark = pytest.mark.timeout(60)
DEPLOYMENT = "registry-bucket"
PREFIX = deployment_prefix(DEPLOYMENT)
GRANTS = module_iam.read_module()


def functions(fake: ComputeFake, grants: module_iam.FunctionGrants = GRANTS) -> GceCompute:
    """The functions' adapter, carrying their token, which the fake holds to `grants`."""
    fake.enforce(FUNCTIONS_TOKEN, grants, PREFIX, VM_SERVICE_ACCOUNT)
    placement = dataclasses.replace(PLACEMENT, service_account=VM_SERVICE_ACCOUNT)
    return GceCompute(PROJECT, REGION, placement=placement, endpoint=fake.endpoint, operation_timeout=30,
                      deployment=DEPLOYMENT, token=FUNCTIONS_TOKEN)


def request(job_id: str, nodes: int, zone: str | None) -> LaunchRequest:
    return LaunchRequest(job_id=job_id, attempt=1, num_nodes=nodes, instance_type="n2-standard-4", zone=zone,
                         image="", spot=True, user_data="#!/bin/bash\n", max_runtime=3600, disk_gb=50, owner="alice")


def test_the_modules_grants_serve_every_call_the_functions_make(compute_fake: ComputeFake) -> None:
    gce = functions(compute_fake)
    launched = [i.id for r in (request("one", 1, "us-central1-a"), request("two", 2, "us-central1-b"),
                               request("region", 2, None)) for i in gce.launch(r)]
    assert len(launched) == 5 and all(name.split("/")[-1].startswith(PREFIX) for name in launched)
    assert len(gce.list_managed()) == 5
    gce.console_output(launched[0])
    assert gce.find(launched[1]) is not None
    gce.terminate(launched)
    assert not gce.list_managed()


@pytest.mark.parametrize("taken", ["compute.instances.setLabels", "compute.disks.create", "compute.instances.create"])
def test_a_grant_taken_out_of_the_module_fails_the_launch_naming_the_permission(
        compute_fake: ComputeFake, taken: str) -> None:
    grants = dataclasses.replace(GRANTS, compute=GRANTS.compute - {taken}, own_vms=GRANTS.own_vms - {taken})
    with pytest.raises(Exception, match=f"Required '{taken}' permission for 'projects/{PROJECT}/zones/"):
        functions(compute_fake, grants).launch(request("denied", 1, "us-central1-a"))
    assert not compute_fake.instances()


def test_only_the_deployments_vms_may_be_deleted_and_only_the_vms_account_attached() -> None:
    def refused(call: str, name: str | None = None, **vm: object) -> tuple[str, str] | None:
        return gce_permissions.denied(GRANTS, PREFIX, VM_SERVICE_ACCOUNT, call, "zones/us-central1-a", [name],
                                      [{"name": name, **vm}] if vm else [])

    assert refused("delete", f"{PREFIX}job-1-0") is None and refused("get", "anyones-vm") is None
    assert refused("delete", "anyones-vm") == ("compute.instances.delete", "zones/us-central1-a/instances/anyones-vm")
    assert refused("getSerialPortOutput", "jobplane-other1-job") == (
        "compute.instances.getSerialPortOutput", "zones/us-central1-a/instances/jobplane-other1-job")
    assert refused("insert", f"{PREFIX}x", serviceAccounts=[{"email": VM_SERVICE_ACCOUNT}]) is None
    assert refused("insert", f"{PREFIX}x", serviceAccounts=[{"email": "owner@p.iam.gserviceaccount.com"}]) == (
        gce_permissions.ACT_AS, "serviceAccounts/owner@p.iam.gserviceaccount.com")
    assert refused("insert", "not-ours", labels={"a": "b"}) == (
        "compute.instances.setLabels", "zones/us-central1-a/instances/not-ours")
    assert refused("waitOperation") is None
    assert gce_permissions.denied(GRANTS, PREFIX, VM_SERVICE_ACCOUNT, "aggregatedList", "global") is None


def test_the_functions_token_reaches_the_registry_alone_and_sts_never_widens_it() -> None:
    held = (fake_sts.Rule(DEPLOYMENT, fake_sts.ROLE_PERMISSIONS[GRANTS.registry_role], None),)
    fake = FakeGcsServer(grants={FUNCTIONS_TOKEN: held})
    fake.start()
    try:
        for bucket in (DEPLOYMENT, "someone-elses"):
            fake.create_bucket(bucket)
        creds = access_token_credentials(FUNCTIONS_TOKEN)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("STORAGE_EMULATOR_HOST", fake.endpoint)
            registry = GcsStore(DEPLOYMENT, project=PROJECT, credentials=creds)
            registry.put("jobs/a/job.json", b"{}")
            assert registry.get("jobs/a/job.json").data == b"{}" and [o.key for o in registry.list("jobs/")]
            registry.delete("jobs/a/job.json")
            with pytest.raises(AccessDenied):
                GcsStore("someone-elses", project=PROJECT, credentials=creds).put("x", b"x")
            GcsStore("someone-elses", project=PROJECT).put("x", b"x")  # no token: not checked
        wide = (fake_sts.Rule("someone-elses", frozenset({"get", "list"}), None),
                fake_sts.Rule(DEPLOYMENT, frozenset({"get", "create"}), None))
        assert fake_sts.within(wide, held) == (wide[1],)
    finally:
        fake.stop()
