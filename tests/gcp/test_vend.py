"""GCP credential vending, end to end over the fakes: functions/gcp/main.py `vend` through functions-framework,
the VMs' identity tokens signed by the local issuer and verified by google-auth against its certificates on
loopback, the VMs looked up in the Compute fake, and the downscoped tokens minted by the GCS fake's STS and
enforced by the GCS fake on every request that bears them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
from functions_framework import create_app
from google.oauth2.credentials import Credentials

from jobplane.clouds.base import AccessDenied, CredentialsRefused, PreconditionFailed
from jobplane.clouds.gcp_vend import vended_credentials
from jobplane.clouds.gcs import GcsStore
from jobplane.local.cloud_functions import HttpFunction
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.local.gce_metadata_server import VM_ACCESS_TOKEN, FakeGceMetadataServer
from jobplane.local.google_identity import LocalIdentityIssuer
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from tests.gcp.conftest import BUCKET, PLACEMENT, PROJECT, GcpCloud
from tests.gcp.helpers import MAIN

pytestmark = pytest.mark.timeout(120)
SPEC = "run: python3 train.py\ninstance_type: n2-standard-4\ncloud: gcp\nzones: [us-central1-a]\n"
AUDIENCE = "https://us-central1-jobplane-local.cloudfunctions.net/jobplane-vend"
VM_ACCOUNT = str(PLACEMENT.service_account)


@pytest.fixture
def issuer() -> Iterator[LocalIdentityIssuer]:
    server = LocalIdentityIssuer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def vending(cloud: GcpCloud, issuer: LocalIdentityIssuer, monkeypatch: pytest.MonkeyPatch) -> GcpCloud:
    """Jobs job-a and job-b launched (one VM each) by the launcher function; the vend function's environment."""
    for name, value in {"JOBPLANE_VEND_URL": AUDIENCE, "JOBPLANE_VM_SERVICE_ACCOUNT": VM_ACCOUNT,
                        "JOBPLANE_GOOGLE_CERTS_URL": issuer.certs_url,
                        "JOBPLANE_STS_URL": cloud.gcs_fake.sts_url}.items():
        monkeypatch.setenv(name, value)
    launcher = create_app("launcher", MAIN, "cloudevent").test_client()
    for job in ("job-a", "job-b"):
        key = keys.queue_entry(job)
        cloud.registry.store.put(cloud.registry.key(key), SPEC.encode(), "application/yaml")
        assert launcher.post("/", **_finalized("reg/" + key)).status_code == 200
        assert cloud.registry.job(job).state == State.LAUNCHING
    return cloud


def _finalized(name: str) -> dict[str, Any]:
    return {"headers": {"ce-id": name, "ce-specversion": "1.0", "ce-type": "google.cloud.storage.object.v1.finalized",
                        "ce-source": f"//storage.googleapis.com/projects/_/buckets/{BUCKET}",
                        "ce-subject": f"objects/{name}", "Content-Type": "application/json"},
            "data": json.dumps({"bucket": BUCKET, "name": name, "generation": "1"})}


def _vm(cloud: GcpCloud, job: str) -> dict[str, Any]:
    [vm] = [v for v in cloud.compute_fake.instances() if v["labels"].get("jobplane-job-id") == job]
    return vm


def _instance_id(vm: dict[str, Any]) -> str:
    return f"{vm['zone'].rsplit('/', 1)[-1]}/{vm['name']}"


def identity(issuer: LocalIdentityIssuer, vm: dict[str, Any], *, audience: str = AUDIENCE,
             email: str = VM_ACCOUNT, project: str = PROJECT, name: str | None = None) -> str:
    """The token the VM's metadata server gives it (format=full)."""
    return issuer.vm_identity(audience=audience, email=email, project=project, zone=vm["zone"].rsplit("/", 1)[-1],
                              name=name or vm["name"], instance_id=str(vm["id"]))


def ask(token: str, job: str, attempt: Any = 1, **extra: Any) -> tuple[int, dict[str, Any]]:
    client = create_app("vend", MAIN, "http").test_client()
    response = client.post("/", json={"identity_token": token, "job_id": job, "attempt": attempt, **extra})
    return response.status_code, response.get_json()


def data(job: str) -> keys.JobData:
    """Where job-a's and job-b's data is: the default owner's folder (their drops are straight under queue/)."""
    return keys.JobData(job, keys.DEFAULT_OWNER)


def store_with(token: str) -> GcsStore:
    return GcsStore(BUCKET, project=PROJECT, credentials=Credentials(token))  # type: ignore[no-untyped-call]


def granted(vending: GcpCloud, issuer: LocalIdentityIssuer, job: str) -> str:
    vm = _vm(vending, job)
    status, body = ask(identity(issuer, vm), job, instance_id=_instance_id(vm))
    assert status == 200, body
    assert body["expires_in"] > 0
    return str(body["access_token"])


# ---- 1. who gets credentials ------------------------------------------------------------------------------
def test_an_instance_of_another_job_is_refused(vending: GcpCloud, issuer: LocalIdentityIssuer) -> None:
    status, body = ask(identity(issuer, _vm(vending, "job-b")), "job-a")
    assert status == 403 and "is not an instance of job job-a attempt 1" in body["refused"]


def test_a_finished_attempt_is_refused(vending: GcpCloud, issuer: LocalIdentityIssuer) -> None:
    token = identity(issuer, _vm(vending, "job-a"))
    assert ask(token, "job-a")[0] == 200
    vending.registry.transition("job-a", State.RUNNING, now=utcnow())
    vending.registry.transition("job-a", State.SUCCEEDED, now=utcnow(), reason="exit 0")
    status, body = ask(token, "job-a")
    assert status == 403 and "job job-a is SUCCEEDED" in body["refused"]
    status, body = ask(token, "job-b")  # nor does the VM get another live job's
    assert status == 403 and "is not an instance of job job-b" in body["refused"]


def test_an_earlier_attempt_is_refused(vending: GcpCloud, issuer: LocalIdentityIssuer) -> None:
    status, body = ask(identity(issuer, _vm(vending, "job-a")), "job-a", attempt=2)
    assert status == 403 and "attempt 2 of job job-a is over" in body["refused"]


@pytest.mark.parametrize("forgery", ["another issuer", "another audience", "another account", "another project",
                                     "no such VM", "not a token"])
def test_an_unknown_caller_is_refused(vending: GcpCloud, issuer: LocalIdentityIssuer, forgery: str) -> None:
    vm = _vm(vending, "job-a")
    if forgery == "another issuer":  # a key whose certificates the function does not trust
        with LocalIdentityIssuer() as stranger:
            token = identity(stranger, vm)
    else:
        stranger_account = "someone@jobplane-local.iam.gserviceaccount.com"
        token = {"another audience": lambda: identity(issuer, vm, audience="https://elsewhere.example/vend"),
                 "another account": lambda: identity(issuer, vm, email=stranger_account),
                 "another project": lambda: identity(issuer, vm, project="other-project"),
                 "no such VM": lambda: identity(issuer, vm, name="jobplane-nobody-a1-0001"),
                 "not a token": lambda: "not.a.jwt"}[forgery]()
    status, body = ask(token, "job-a")
    assert status == 403, body
    assert body["refused"]


def test_a_forged_instance_id_in_the_body_is_refused(vending: GcpCloud, issuer: LocalIdentityIssuer) -> None:
    a_vm, b_vm = _vm(vending, "job-a"), _vm(vending, "job-b")
    status, body = ask(identity(issuer, b_vm), "job-a", instance_id=_instance_id(a_vm))
    assert status == 403 and "names instance" in body["refused"]


@pytest.mark.parametrize(("body", "field"), [
    ({"job_id": "job-a", "attempt": 1}, "identity_token"),
    ({"identity_token": "x", "attempt": 1}, "job_id"),
    ({"identity_token": "x", "job_id": "../job-a", "attempt": 1}, "job_id"),
    ({"identity_token": "x", "job_id": "job-a", "attempt": "1"}, "attempt"),
    ({"identity_token": "x", "job_id": "job-a", "attempt": 1, "instance_id": 7}, "instance_id"),
])
def test_bad_input_is_a_400_naming_the_field(vending: GcpCloud, body: dict[str, Any], field: str) -> None:
    response = create_app("vend", MAIN, "http").test_client().post("/", json=body)
    assert response.status_code == 400 and response.get_json()["error"].startswith(field + ":")


def test_a_vm_of_the_job_gets_a_token_that_works_on_its_own_keys(vending: GcpCloud,
                                                                  issuer: LocalIdentityIssuer) -> None:
    store = store_with(granted(vending, issuer, "job-a"))
    record = store.get("reg/" + keys.job_record("job-a"))  # its record, its cluster.json, its checkpoints
    assert json.loads(record.data)["id"] == "job-a"
    store.put("reg/" + keys.heartbeat("job-a", 1, 0), b"{}")
    store.put("reg/" + keys.log_chunk(data("job-a"), 1, 0, 1), b"step 1\n")
    assert [i.key for i in store.list("reg/" + keys.heartbeats_prefix("job-a"))] == [
        "reg/" + keys.heartbeat("job-a", 1, 0)]


# ---- 2. what the token reaches ------------------------------------------------------------------------------
def test_the_boundary_names_only_the_jobs_keys(vending: GcpCloud, issuer: LocalIdentityIssuer) -> None:
    token = granted(vending, issuer, "job-a")
    [rw, ro] = vending.gcs_fake.boundaries[token]["accessBoundary"]["accessBoundaryRules"]
    objects = f"projects/_/buckets/{BUCKET}/objects/"
    assert rw["availablePermissions"] == ["inRole:roles/storage.objectUser"]
    assert ro["availablePermissions"] == ["inRole:roles/storage.objectViewer"]
    assert {r["availableResource"] for r in (rw, ro)} == {f"//storage.googleapis.com/projects/_/buckets/{BUCKET}"}
    listing = "api.getAttribute('storage.googleapis.com/objectListPrefix', '')"
    # what its agents write: its data folder, heartbeats, the attempt's exit reports, boot failure, preempted marker
    assert rw["availabilityCondition"]["expression"].split(" || ") == [
        f"resource.name.startsWith('{objects}reg/teams/default/job-a/')",
        f"resource.name.startsWith('{objects}reg/heartbeats/job-a/')",
        f"resource.name.startsWith('{objects}reg/jobs/job-a/attempts/1/nodes/')",
        f"{listing}.startsWith('reg/teams/default/job-a/')", f"{listing}.startsWith('reg/heartbeats/job-a/')",
        f"{listing}.startsWith('reg/jobs/job-a/attempts/1/nodes/')",
        f"resource.name == '{objects}reg/preempted-jobs/job-a'",
        f"resource.name == '{objects}reg/jobs/job-a/attempts/1/boot-failure.json'"]
    # and what it only reads: never its record's folder whole, so never its record, events or cluster.json to write
    assert ro["availabilityCondition"]["expression"].split(" || ") == [
        f"resource.name.startsWith('{objects}reg/system/agent/')", f"{listing}.startsWith('reg/system/agent/')",
        f"resource.name == '{objects}reg/jobs/job-a/job.json'",
        f"resource.name == '{objects}reg/jobs/job-a/attempts/1/cluster.json'",
        f"resource.name == '{objects}reg/jobs/job-a/control/stop'"]


def _job_actions(store: GcsStore, job: str) -> list[Callable[[], object]]:
    """Read its code and record, write its logs, heartbeats and preempted marker, list and delete checkpoints."""
    checkpoints = "reg/" + keys.checkpoints_prefix(data(job))
    return [lambda: store.get("reg/" + keys.code_bundle(data(job))),
            lambda: store.get("reg/" + keys.job_record(job)),
            lambda: store.put("reg/" + keys.log_chunk(data(job), 1, 0, 1), b"line\n"),
            lambda: store.put("reg/" + keys.heartbeat(job, 1, 0), b"{}"),
            lambda: list(store.list(checkpoints)),
            lambda: store.delete(checkpoints + "files/0/1-a1/model.pt"),
            lambda: store.put_if_absent("reg/" + keys.preempted_marker(job), b"{}")]


def test_job_as_token_cannot_touch_job_bs_keys_and_can_its_own(vending: GcpCloud,
                                                                issuer: LocalIdentityIssuer) -> None:
    admin = vending.registry.store  # unenforced: the functions' own access
    for job in ("job-a", "job-b"):
        admin.put("reg/" + keys.code_bundle(data(job)), b"code of " + job.encode())
        admin.put(f"reg/{keys.checkpoints_prefix(data(job))}files/0/1-a1/model.pt", b"weights")
    store = store_with(granted(vending, issuer, "job-a"))

    def forbidden(action: Any) -> None:
        with pytest.raises(AccessDenied):
            action()

    for action in _job_actions(store, "job-b"):
        forbidden(action)
    for action in _job_actions(store, "job-a"):
        action()
    forbidden(lambda: store.get("reg/" + keys.POLICY))
    forbidden(lambda: store.put("reg/" + keys.queue_entry("job-c"), SPEC.encode()))
    forbidden(lambda: list(store.list("reg/jobs/")))  # a listing wider than its folder
    forbidden(lambda: store.put("reg/" + keys.agent_file("manifest.json"), b"{}"))  # bundles: read-only
    assert store.get("reg/" + keys.agent_file("manifest.json")).data


def test_a_jobs_token_writes_nothing_the_functions_decide_on_its_own_record_included(
        vending: GcpCloud, issuer: LocalIdentityIssuer) -> None:
    """Its record (owner, code, usage and price, state), its events, cluster.json, the ignored-fact flags, admission
    records and stop requests are the control plane's: a job that could rewrite its own job.json could name another
    team's code bundle for its next grant, or price its usage at $0."""
    store = store_with(granted(vending, issuer, "job-a"))
    record = json.loads(store.get("reg/" + keys.job_record("job-a")).data)
    forged = {**record, "owner": "team-b", "spec": {**record["spec"], "owner": "team-b",
                                                  "code": f"gs://{BUCKET}/reg/code/team-b/b.tar.gz"},
              "usage": [{**u, "price": 0.0} for u in record.get("usage", [])]}
    trusted = [keys.job_record("job-a"), keys.event("job-a", keys.stamp(datetime.now(UTC)), "created"),
               keys.cluster("job-a", 1), keys.ignored_flag("job-a", 1, keys.exit_report("job-a", 1, 0)),
               keys.stop_request("job-a"), keys.admission_owner("default"), keys.ADMISSION_DEPLOYMENT,
               keys.queue_entry("job-z"), keys.cancel_request("default", "job-a"), keys.sweep_record("job-a")]
    for key in trusted:
        with pytest.raises(AccessDenied):
            store.put("reg/" + key, json.dumps(forged).encode())
    with pytest.raises(AccessDenied):
        store.delete("reg/" + keys.job_record("job-a"))
    assert json.loads(vending.registry.get_bytes(keys.job_record("job-a")))["spec"]["owner"] == "default"


def test_generation_preconditions_hold_for_a_downscoped_token(vending: GcpCloud,
                                                              issuer: LocalIdentityIssuer) -> None:
    store = store_with(granted(vending, issuer, "job-a"))
    key = "reg/" + keys.exit_report("job-a", 1, 0)
    version = store.put_if_absent(key, b"{}")
    with pytest.raises(PreconditionFailed):
        store.put_if_absent(key, b"{}")
    with pytest.raises(PreconditionFailed):
        store.put_if_match(key, b"{}", str(int(version) + 1))
    assert store.put_if_match(key, b'{"code": 0}', version) != version


def test_a_refusal_is_the_json_gcs_answers(vending: GcpCloud, issuer: LocalIdentityIssuer) -> None:
    token = granted(vending, issuer, "job-a")
    name = f"reg%2F{keys.job_record('job-b').replace('/', '%2F')}"
    response = requests.get(f"{vending.gcs_fake.endpoint}/storage/v1/b/{BUCKET}/o/{name}?alt=media",
                            headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == 403 and error["errors"][0]["reason"] == "forbidden"
    assert "storage.objects.get" in error["message"]


# ---- the VM's own token ---------------------------------------------------------------------------------
@pytest.fixture
def vm_enforcing_gcs() -> Iterator[FakeGcsServer]:
    fake = FakeGcsServer(vm_reads=(f"{BUCKET}/reg/{keys.AGENT}",))
    fake.start()
    try:
        fake.create_bucket(BUCKET)
        fake.create_bucket("datasets")
        yield fake
    finally:
        fake.stop()


def test_the_vms_own_token_reads_the_agent_bundles_and_data_buckets_only(vm_enforcing_gcs: FakeGcsServer) -> None:
    base, auth = vm_enforcing_gcs.endpoint, {"Authorization": f"Bearer {VM_ACCESS_TOKEN}"}

    def call(method: str, bucket: str, name: str, token: dict[str, str] = auth) -> int:
        quoted = name.replace("/", "%2F")
        if method == "PUT":
            url = f"{base}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quoted}"
            return requests.post(url, data=b"x", headers=token, timeout=10).status_code
        return requests.get(f"{base}/storage/v1/b/{bucket}/o/{quoted}?alt=media", headers=token,
                            timeout=10).status_code

    for bucket, name in ((BUCKET, "reg/system/agent/manifest.json"), (BUCKET, "reg/jobs/a/job.json"),
                         ("datasets", "train/0.bin")):
        assert call("PUT", bucket, name, {}) == 200  # set up without a token: unenforced
    assert call("GET", BUCKET, "reg/system/agent/manifest.json") == 200
    assert call("GET", "datasets", "train/0.bin") == 200
    assert call("GET", BUCKET, "reg/jobs/a/job.json") == 403
    assert call("PUT", BUCKET, "reg/jobs/a/attempts/1/boot-failure.json") == 403
    assert call("PUT", BUCKET, "reg/system/agent/manifest.json") == 403
    assert call("PUT", "datasets", "train/1.bin") == 403


# ---- the agent's credentials ----------------------------------------------------------------------------
@pytest.fixture
def vend_endpoint(vending: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The vend function over real HTTP on loopback, its URL the audience, as the VMs call it."""
    server = HttpFunction(create_app("vend", MAIN, "http"))
    server.start()
    try:
        monkeypatch.setenv("JOBPLANE_VEND_URL", server.url)
        yield server.url
    finally:
        server.stop()


def metadata_of(vm: dict[str, Any], issuer: LocalIdentityIssuer) -> FakeGceMetadataServer:
    return FakeGceMetadataServer(instance_id=str(vm["id"]), name=vm["name"], zone=vm["zone"].rsplit("/", 1)[-1],
                                 project=PROJECT, issuer=issuer, service_account=VM_ACCOUNT)


def test_the_agents_credentials_refresh_from_the_vend_function(vending: GcpCloud, issuer: LocalIdentityIssuer,
                                                               vend_endpoint: str) -> None:
    with metadata_of(_vm(vending, "job-a"), issuer) as metadata:
        credentials = vended_credentials(vend_endpoint, "job-a", 1, metadata.host)
        store = GcsStore(BUCKET, project=PROJECT, credentials=credentials)
        store.put("reg/" + keys.heartbeat("job-a", 1, 0), b"{}")  # the first request refreshes
        assert credentials.valid and credentials.expiry is not None
        assert (credentials.expiry - utcnow().replace(tzinfo=None)).total_seconds() > 3000
        with pytest.raises(AccessDenied):
            store.get("reg/" + keys.job_record("job-b"))


def test_the_agent_hears_a_refusal_as_credentials_refused(vending: GcpCloud, issuer: LocalIdentityIssuer,
                                                          vend_endpoint: str) -> None:
    with metadata_of(_vm(vending, "job-b"), issuer) as metadata:  # job-b's VM claiming job-a
        store = GcsStore(BUCKET, project=PROJECT, credentials=vended_credentials(vend_endpoint, "job-a", 1,
                                                                                 metadata.host))
        with pytest.raises(CredentialsRefused, match="is not an instance of job job-a"):
            store.get("reg/" + keys.job_record("job-a"))
