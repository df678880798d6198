"""The one place that turns Settings into a registry's store, code uploader and Compute adapter, per cloud:
S3 and EC2, or GCS and Compute Engine. Every SDK is imported here lazily, only for the cloud in use
(google-cloud-compute alone takes about a second), and the Compute adapter only when a command needs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from jobplane.clouds.base import Compute, ObjectStore, SecretStore
from jobplane.ops import jobs
from jobplane.settings import Settings
from jobplane.store.registry import Registry

# A context around one upload that yields advance(bytes sent since the last call): a progress bar, or nothing.
Progress = Callable[[Path], AbstractContextManager[Callable[[int], None]]]


class BackendError(RuntimeError):
    """What reaching the cloud's VM API needs is not set; the message says what to set (jobplane.sdk raises it as
    its own BackendError)."""


@contextlib.contextmanager
def no_progress(path: Path) -> Iterator[Callable[[int], None]]:
    yield lambda sent: None


def _store(settings: Settings) -> ObjectStore:
    if settings.cloud == "gcp":
        from jobplane.clouds.gcs import GcsStore, access_token_credentials

        # a person's own token (JOBPLANE_GCS_TOKEN), so IAM holds their calls to their team's grants
        credentials = access_token_credentials(settings.gcs_token) if settings.gcs_token else None
        return GcsStore(settings.bucket, project=settings.project, credentials=credentials)
    from jobplane.clouds.s3 import S3Store, s3_client

    return S3Store(settings.bucket, s3_client(settings.region))


def registry(settings: Settings) -> Registry:
    return Registry(_store(settings), settings.root)


def compute(settings: Settings, reg: Registry) -> Compute:
    """The deployment's Compute adapter. On GCP the project is the policy's gcp.project, else the settings'
    (GOOGLE_CLOUD_PROJECT), and their compute_endpoint (JOBPLANE_COMPUTE_ENDPOINT) points it at a local fake."""
    if settings.cloud == "gcp":
        from jobplane.clouds.gcp import GceCompute

        try:
            return GceCompute.from_settings(settings, reg.policy().gcp)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
    from jobplane.clouds.aws import Ec2Compute

    return Ec2Compute(region=settings.region, deployment=settings.deployment)


def secrets(settings: Settings) -> SecretStore:
    """The deployment's secret store: SSM Parameter Store (clouds/aws_secrets.py) on AWS, Secret Manager
    (clouds/gcp_secrets.py) on GCP, with a person's token when JOBPLANE_GCS_TOKEN gives one."""
    if settings.cloud == "gcp":
        from jobplane.clouds.gcp_secrets import secret_manager

        if not settings.project:
            raise BackendError("secrets on GCP need the project: set GOOGLE_CLOUD_PROJECT")
        return secret_manager(settings.project, settings.deployment, settings.secrets_endpoint, settings.gcs_token)
    from jobplane.clouds.aws_secrets import ssm_secrets

    return ssm_secrets(settings.region, settings.deployment)


def connect(settings: Settings, progress: Progress = no_progress) -> jobs.Backend:
    """The registry, the bucket's URL, a Compute factory and a code uploader (reporting to progress)."""
    store = _store(settings)
    reg = Registry(store, settings.root)

    def upload(key: str, path: Path) -> None:
        with progress(path) as advance:
            store.upload_file(reg.key(key), path, "application/gzip", advance)

    return jobs.Backend(reg, settings.url, lambda: compute(settings, reg), upload)
