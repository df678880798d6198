"""What a deployment is configured with: read from the environment here, once, by the entry points (the
functions, the CLI, the agent), and passed down as arguments; no other core module reads the environment.

A registry is named by URL, `s3://bucket[/root]` or `gs://bucket[/root]`, whose scheme says the cloud; or by
a bare bucket name, whose cloud comes from JOBPLANE_CLOUD (or the caller), AWS by default. The variables:

    JOBPLANE_BUCKET            the registry: a URL or a bare bucket name
    JOBPLANE_ROOT              the registry's prefix in the bucket, when the URL has no path
    JOBPLANE_CLOUD             aws | gcp, for a bare bucket name
    JOBPLANE_REGION            the deployment's region (on AWS, AWS_REGION / AWS_DEFAULT_REGION also serve)
    JOBPLANE_NOTIFY_TOPIC      the job-notification topic (an SNS ARN, or projects/<p>/topics/<t>); unset: off
    JOBPLANE_VEND_URL          the credential vending function a job's agent asks for its job's storage
                               credentials (the launcher hands it to the VMs; unset: VMs use their own identity)
    JOBPLANE_GCS_TOKEN         an access token every GCS call of the CLI and SDK carries instead of Application
                               Default Credentials: `gcloud auth print-access-token`'s, for a person whose calls
                               must carry their own identity (on the local cloud, a member's token member-<owner>;
                               its functions carry their service account's, with JOBPLANE_COMPUTE_TOKEN)
    JOBPLANE_COMPUTE_TOKEN     an access token every Compute Engine call carries instead of the endpoint's anonymity
    GOOGLE_CLOUD_PROJECT       the GCP project (the policy's gcp.project wins for Compute Engine)
    JOBPLANE_COMPUTE_ENDPOINT  the Compute Engine API elsewhere than Google (a local fake), anonymously
    PUBSUB_EMULATOR_HOST       Pub/Sub elsewhere than Google (host:port), anonymously
The SDKs read their own variables themselves: AWS_ENDPOINT_URL (S3 and EC2 elsewhere than AWS, e.g. the
local cloud's moto) and STORAGE_EMULATOR_HOST (GCS elsewhere than Google, anonymously).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

CLOUDS = {"s3": "aws", "gs": "gcp"}  # URL scheme -> cloud
SCHEMES = {cloud: scheme for scheme, cloud in CLOUDS.items()}


@dataclass(frozen=True)
class Settings:
    bucket: str
    root: str = ""
    region: str | None = None
    cloud: str = "aws"
    notify_topic: str | None = None
    project: str | None = None
    compute_endpoint: str | None = None
    secrets_endpoint: str | None = None  # Secret Manager's API, or the local GCP cloud's fake of it
    pubsub_emulator: str | None = None
    vend_url: str | None = None
    gcs_token: str | None = field(default=None, repr=False)  # a credential: never in a log line
    compute_token: str | None = field(default=None, repr=False)  # the same

    @property
    def deployment(self) -> str:
        """The deployment's identity, tagged on every VM it launches: its registry, bucket[/root]."""
        return f"{self.bucket}/{self.root}" if self.root else self.bucket

    @property
    def url(self) -> str:
        """The bucket's URL (s3://b, gs://b): objects in it are named by this plus their key."""
        return f"{SCHEMES[self.cloud]}://{self.bucket}"

    @classmethod
    def from_env(cls, bucket: str | None = None, cloud: str | None = None, region: str | None = None, *,
                 environ: Mapping[str, str] | None = None) -> Settings:
        """bucket, cloud and region as given (the CLI's --bucket, --cloud, --region), else from the variables
        (of environ, else of this process)."""
        env = (os.environ if environ is None else environ).get
        named = bucket or env("JOBPLANE_BUCKET", "")
        if not named:
            raise RuntimeError("no registry bucket: set JOBPLANE_BUCKET or pass --bucket (s3://BUCKET or gs://BUCKET)")
        found, name, root = parse_registry(named)
        if found and cloud and cloud != found:
            raise RuntimeError(f"the registry {named} is on {found}, not {cloud}: drop --cloud or fix the URL")
        cloud = found or cloud or env("JOBPLANE_CLOUD") or "aws"
        if cloud not in SCHEMES:
            raise RuntimeError(f"unknown cloud {cloud!r} (JOBPLANE_CLOUD): use aws or gcp")
        fallback = (env("AWS_REGION") or env("AWS_DEFAULT_REGION")) if cloud == "aws" else None
        return cls(bucket=name, root=root if root is not None else env("JOBPLANE_ROOT", ""),
                   region=region or env("JOBPLANE_REGION") or fallback, cloud=cloud,
                   notify_topic=env("JOBPLANE_NOTIFY_TOPIC") or None, project=env("GOOGLE_CLOUD_PROJECT") or None,
                   compute_endpoint=env("JOBPLANE_COMPUTE_ENDPOINT") or None,
                   secrets_endpoint=env("JOBPLANE_SECRETS_ENDPOINT") or None,
                   pubsub_emulator=env("PUBSUB_EMULATOR_HOST") or None, vend_url=env("JOBPLANE_VEND_URL") or None,
                   gcs_token=env("JOBPLANE_GCS_TOKEN") or None, compute_token=env("JOBPLANE_COMPUTE_TOKEN") or None)


def parse_registry(named: str) -> tuple[str | None, str, str | None]:
    """(cloud or None for a bare name, bucket, root or None when the URL has no path)."""
    scheme, sep, rest = named.partition("://")
    if not sep:
        return None, named.strip("/"), None
    if scheme not in CLOUDS:
        raise RuntimeError(f"{named}: a registry URL is s3://BUCKET[/ROOT] or gs://BUCKET[/ROOT]")
    bucket, _, root = rest.partition("/")
    if not bucket:
        raise RuntimeError(f"{named}: no bucket name")
    return CLOUDS[scheme], bucket, root.strip("/") or None
