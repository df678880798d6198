"""The local GCP cloud: the GCS fake in its own process, the Compute Engine fake in this one (the real
google-cloud clients reach both over loopback), each managed VM a local process tree that runs its real
startup-script with its own metadata server (jobplane.local.gce_runner), and functions/gcp/main.py's entry
points through functions-framework (jobplane.local.cloud_functions): bucket events and Cloud Scheduler ticks
delivered the way the trigger loop delivers the AWS ones; the job notifications they publish reach a Pub/Sub
topic on loopback (jobplane.local.pubsub_topic). Every VM's networkIP is on loopback.

Credentials go the way they go on GCP: each VM's metadata server signs identity tokens with the key of a local
issuer (jobplane.local.google_identity, its certificates on loopback), the `vend` function verifies them and
exchanges its token at the GCS fake's STS for one downscoped to the job's keys, and the GCS fake enforces that
token's boundary, and lets the VM's own token read only the agent bundles. A token member-<owner> (member_exports)
gets what infra/gcp grants a member of that owner's team (jobplane.local.gcp_grants), and the functions carry their
service account's token, which the GCS and Compute fakes hold to what infra/gcp grants it (jobplane.local.module_iam).

Images: the Ubuntu families stand for this machine; Debian 12's family is the stock Debian 12 image when it is
built (jobplane.local.rootfs), and PODMAN_IMAGE the Debian 12 + podman image when that is.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
from pathlib import Path
from typing import IO, Any

from jobplane.boot import bundling
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID, TAG_MANAGED
from jobplane.clouds.gce_metadata import gce_key
from jobplane.clouds.gcp import deployment_prefix
from jobplane.local import gcp_grants, module_iam, rootfs
from jobplane.local.changes import HttpCounts
from jobplane.local.cloud import LocalCloud, PortInUse, ServiceProcess
from jobplane.local.cloud_functions import CloudFunctions, HttpFunction
from jobplane.local.fake_compute import DEFAULT_ZONES, FakeComputeServer
from jobplane.local.fake_secrets import FakeSecretManager
from jobplane.local.google_identity import VM_SERVICE_ACCOUNT, LocalIdentityIssuer
from jobplane.local.module_iam import FUNCTIONS_TOKEN
from jobplane.local.pubsub_topic import PubSubTopic
from jobplane.local.triggers import Functions
from jobplane.model import images, keys
from jobplane.store.registry import Registry

log = logging.getLogger("local-cloud")

PROJECT = "jobplane-local"
REGION = "us-central1"
TOPIC = f"projects/{PROJECT}/topics/jobplane-jobs"
PODMAN_IMAGE = f"projects/{PROJECT}/global/images/debian-12-podman"  # what a spec's `image:` names


class GcpLocalCloud(LocalCloud):
    cloud = "gcp"
    hidden_env = ("AWS_", "PUBSUB_EMULATOR_HOST")

    def __init__(self, state_dir: Path, port: int = 0, tick: float = 1.0, **kwargs: Any) -> None:
        super().__init__(state_dir, port, tick, **kwargs)
        # the VMs' own token reads the agent bundles only, a member's its team's grants (the registry has no root),
        # the functions' what infra/gcp grants their service account (none where the module cannot be read here)
        self.grants = module_iam.load()
        functions = ["--grant", f"{FUNCTIONS_TOKEN}={self.grants.registry_role}"] if self.grants else []
        self.gcs = ServiceProcess("jobplane.local.fake_gcs", port, "--bucket", self.bucket,
                                  "--vm-reads", f"{self.bucket}/{keys.AGENT}", "--member-grants", self.bucket,
                                  *functions)
        self.compute = FakeComputeServer(PROJECT, op_polls=0, consoles=self.state_dir / "instances",
                                         port=port + 1 if port else 0)
        if self.grants:
            self.compute.enforce(FUNCTIONS_TOKEN, self.grants, deployment_prefix(self.bucket), VM_SERVICE_ACCOUNT)
        self.topic = PubSubTopic(TOPIC)
        self.issuer = LocalIdentityIssuer()
        self.secrets = FakeSecretManager()  # Secret Manager, its grants held to the caller's token
        self.vend: HttpFunction | None = None

    @property
    def exports(self) -> dict[str, str]:
        return {"JOBPLANE_BUCKET": f"gs://{self.bucket}", "JOBPLANE_REGION": REGION, "GOOGLE_CLOUD_PROJECT": PROJECT,
                "STORAGE_EMULATOR_HOST": self.gcs.url, "JOBPLANE_COMPUTE_ENDPOINT": self.compute.endpoint,
                "JOBPLANE_SECRETS_ENDPOINT": self.secrets.url}

    def member_exports(self, owner: str) -> dict[str, str]:
        """The exports with a member's token (the GCS fake grants it what infra/gcp grants submitters[owner]) and
        the owner `jobplane submit` drops for."""
        return {**self.exports, "JOBPLANE_GCS_TOKEN": gcp_grants.member_token(owner), "JOBPLANE_OWNER": owner}

    def start_services(self) -> None:
        self.gcs.start(self.state_dir / "gcs.log")
        self.watch.read = HttpCounts(self.gcs.url)  # the Compute fake and Pub/Sub are in this process: asked always
        try:
            self.compute.start()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:  # --port's next one
                raise PortInUse(self.gcs.port + 1) from None
            raise
        self.topic.start()
        self.issuer.start()
        self.secrets.start()

    def stop_services(self) -> None:
        if self.vend is not None:
            self.vend.stop()
        self.secrets.stop()
        self.issuer.stop()
        self.topic.stop()
        self.compute.stop()
        self.gcs.stop()

    def services(self) -> dict[str, int | None]:
        return {"gcs": self.gcs.proc.pid if self.gcs.proc else None}

    def provision(self) -> tuple[Registry, str, dict[str, Path]]:
        from jobplane.clouds.gcs import GcsStore

        # the functions publish job notifications there; vend verifies and exchanges tokens with the fakes
        if self.grants:  # the token their service account's metadata server would give them
            os.environ.update({"JOBPLANE_GCS_TOKEN": FUNCTIONS_TOKEN, "JOBPLANE_COMPUTE_TOKEN": FUNCTIONS_TOKEN})
        os.environ.update({"JOBPLANE_NOTIFY_TOPIC": TOPIC, "PUBSUB_EMULATOR_HOST": self.topic.address,
                           "JOBPLANE_VM_SERVICE_ACCOUNT": VM_SERVICE_ACCOUNT,
                           "JOBPLANE_GOOGLE_CERTS_URL": self.issuer.certs_url,
                           "JOBPLANE_STS_URL": f"{self.gcs.url}/v1/token",
                           "JOBPLANE_SECRETS_ENDPOINT": self.secrets.url})
        # the VMs' service account, as infra/gcp's policy names it (the only one the functions may attach)
        placement = f"gcp:\n  project: {PROJECT}\n  service_account: {VM_SERVICE_ACCOUNT}"
        return Registry(GcsStore(self.bucket, project=PROJECT)), placement, local_images()

    def make_functions(self, log_stream: IO[str]) -> Functions:
        functions = CloudFunctions(self.bucket, log_stream, on_result=self.console.invoked)
        self.vend = HttpFunction(functions.app("vend"))  # the VMs call it over HTTP, on a port it bound itself
        self.vend.start()
        os.environ["JOBPLANE_VEND_URL"] = self.vend.url  # read at each invocation, none of which ran yet
        return functions

    def notifications(self) -> list[dict[str, Any]]:
        return self.topic.pull()

    def make_runner(self, instance_env: dict[str, str], images: dict[str, Path]) -> Any:
        from jobplane.local.gce_runner import GceRunner

        return GceRunner(self.compute, self.state_dir, instance_env, self.cloud_id, self.console.vm, images,
                         issuer=self.issuer)

    def instance_by_hand(self, managed: bool, job_id: str | None, attempt: int | None, user_data: str) -> str:
        labels = {gce_key(TAG_MANAGED): "true"} if managed else {"owner": "not-jobplane"}
        if job_id:
            labels[gce_key(TAG_JOB_ID)] = job_id
        if attempt is not None:
            labels[gce_key(TAG_ATTEMPT)] = str(attempt)
        return self.compute.add_instance(DEFAULT_ZONES[REGION][0], f"by-hand-{secrets.token_hex(4)}", labels,
                                         metadata={"startup-script": user_data} if user_data else None)


def local_images() -> dict[str, Path]:
    """Image (family) -> root fs: Debian 12's and Debian 12 + podman's, when built here (any other image is this
    machine)."""
    problem = rootfs.image_problem()
    if problem:
        log.warning("image debian-12 is not available in this local cloud: %s", problem)
        return {}
    found = {images.ALIASES["debian-12"].gcp[bundling.host_architecture()]: rootfs.image_dir()}
    if problem := rootfs.podman_image_problem():
        log.warning("image debian-12-podman is not available in this local cloud: %s", problem)
    else:
        found[PODMAN_IMAGE] = rootfs.podman_image_dir()
    return found
