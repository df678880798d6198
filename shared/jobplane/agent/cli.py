"""`python3 -m jobplane.agent`: wires the cloud's store and metadata service into the agent.

Every flag falls back to an environment variable, so the local cloud can tune an agent it starts
through the unchanged bootstrap script:
  --cloud            JOBPLANE_CLOUD (aws)            --bucket  JOBPLANE_BUCKET (required)
  --root             JOBPLANE_ROOT ("")              --region  JOBPLANE_REGION / AWS_REGION
  --job, --attempt   JOBPLANE_JOB_ID, JOBPLANE_ATTEMPT (else the instance's jobplane:job-id / :attempt tags)
  --ml-root          JOBPLANE_ML_ROOT (/opt/ml)
  --poweroff-cmd     JOBPLANE_POWEROFF_CMD ("shutdown -h now": on a VM that terminates it)
  --metadata-url     (else AWS_EC2_METADATA_SERVICE_ENDPOINT on EC2, GCE_METADATA_HOST on GCE)
  --vend-url         JOBPLANE_VEND_URL: where to ask for the job's storage credentials (jobplane.decide.vend);
                     unset, the registry is reached with the VM's own identity (tests, an older deployment)
  --log-interval, --heartbeat-interval, --checkpoint-interval, --poll-interval, --stop-grace,
  --cluster-timeout, --checkpoint-settle, --checkpoint-freeze
                     JOBPLANE_AGENT_<FLAG NAME IN CAPITALS> (10, 30, 60, 5, spec, 900, 2, 1 seconds)

SIGTERM and SIGINT stop the job like a stop request: the user process gets its grace (capped so the
final sync fits the VM's shutdown), then the final sync, the exit report and the power-off.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from jobplane.agent.core import Agent, AgentConfig
from jobplane.clouds.base import Metadata, ObjectStore
from jobplane.settings import Settings
from jobplane.store.rooted import RootedStore

DEFAULT_POWEROFF = "shutdown -h now"


def _env_float(name: str) -> float | None:
    value = os.environ.get(f"JOBPLANE_AGENT_{name.upper()}")
    return float(value) if value else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m jobplane.agent",
                                description="Run this VM's node of a jobplane job, report, and power off.")
    env = os.environ.get
    p.add_argument("--cloud", choices=("aws", "gcp"), default=env("JOBPLANE_CLOUD", "aws"))
    p.add_argument("--bucket", default=env("JOBPLANE_BUCKET"), help="registry bucket")
    p.add_argument("--root", default=env("JOBPLANE_ROOT", ""), help="registry root prefix in the bucket")
    p.add_argument("--region", default=env("JOBPLANE_REGION") or env("AWS_REGION"))
    p.add_argument("--job", default=env("JOBPLANE_JOB_ID") or None,
                   help="job id (default: $JOBPLANE_JOB_ID, else the instance's jobplane:job-id tag)")
    p.add_argument("--attempt", type=int, default=env("JOBPLANE_ATTEMPT") or None,
                   help="attempt (default: $JOBPLANE_ATTEMPT, else the instance's jobplane:attempt tag)")
    p.add_argument("--ml-root", type=Path, default=Path(env("JOBPLANE_ML_ROOT", "/opt/ml")),
                   help="SageMaker-style root; spec paths under /opt/ml move under it")
    p.add_argument("--poweroff-cmd", default=env("JOBPLANE_POWEROFF_CMD", DEFAULT_POWEROFF),
                   help="command run at the end (default: %(default)s)")
    p.add_argument("--metadata-url", help="metadata service base URL (tests, the local cloud)")
    defaults = AgentConfig()
    for name in ("log_interval", "heartbeat_interval", "checkpoint_interval", "poll_interval", "stop_grace",
                 "cluster_timeout", "checkpoint_settle", "checkpoint_freeze"):
        fallback = _env_float(name)
        p.add_argument("--" + name.replace("_", "-"), type=float,
                       default=fallback if fallback is not None else getattr(defaults, name))
    p.add_argument("--vend-url", default=env("JOBPLANE_VEND_URL") or None,
                   help="the credential vending function's URL (default: $JOBPLANE_VEND_URL)")
    args = p.parse_args(argv)
    if not args.bucket:
        p.error("no registry bucket: pass --bucket or set JOBPLANE_BUCKET")
    if args.vend_url and (not args.job or args.attempt is None):
        p.error("--vend-url needs --job and --attempt (JOBPLANE_JOB_ID, JOBPLANE_ATTEMPT): credentials are per job")
    return args


Login = Callable[[str], tuple[str, str] | None]


Secrets = Callable[[str, str], bytes] | None


def cloud_adapters(args: argparse.Namespace) -> tuple[Callable[[str], ObjectStore], Metadata, Login, Secrets]:
    """(bucket -> store, metadata, container registry login, (owner, name) -> a secret's value (None without a
    vending URL) for the cloud; SDKs are imported only for the
    cloud in use. With a vending URL the registry's bucket is reached with the job's own credentials (refreshed
    before they expire), any other bucket (the platform's input data) and the cloud's container registry with
    the VM's identity."""
    env = os.environ.get
    if args.cloud == "gcp":
        try:
            from jobplane.clouds.gce_metadata import HOST_ENV, GceMetadata
        except ImportError as exc:
            raise SystemExit(f"jobplane.agent: GCE metadata client unavailable ({exc})") from None
        from jobplane.clouds.gcs import GcsStore

        project, host = env("GOOGLE_CLOUD_PROJECT"), env(HOST_ENV)
        job_credentials, gcp_secrets = None, None
        if args.vend_url:
            from jobplane.clouds.gcp_vend import secret_reader, vended_credentials

            job_credentials = vended_credentials(args.vend_url, args.job, args.attempt, host)
            gcp_secrets = secret_reader(job_credentials)  # the values the vend function's grant carries

        def gcs(bucket: str) -> ObjectStore:
            if job_credentials is not None and bucket == args.bucket:
                return GcsStore(bucket, project=project, credentials=job_credentials)
            return GcsStore(bucket, project=project)
        metadata = GceMetadata(args.metadata_url, host=host)
        return gcs, metadata, metadata.registry_login, gcp_secrets
    from jobplane.clouds.aws_ecr import ecr_login
    from jobplane.clouds.aws_imds import ENDPOINT_ENV, Ec2Metadata
    from jobplane.clouds.s3 import S3Store, s3_client

    job_client, secrets = None, None
    if args.vend_url:
        from jobplane.clouds.aws_secrets import SsmSecrets
        from jobplane.clouds.aws_vend import vended_s3_client, vended_session

        deployment = Settings(args.bucket, args.root.strip("/")).deployment  # as the launcher tagged the VM
        session = vended_session(args.region, args.vend_url, args.job, args.attempt, deployment)
        job_client = vended_s3_client(args.region, args.vend_url, args.job, args.attempt, deployment, session)
        ssm = functools.cache(lambda: SsmSecrets(session.client("ssm", region_name=args.region), deployment))

        def secrets(owner: str, name: str) -> bytes:  # with the job's credentials: its session names them
            return ssm().get(owner, name)
    # The instance's own client, made when first needed: with vended credentials only another bucket (a data
    # channel) needs it, and a client costs a tenth of a CPU second.
    instance_client = functools.cache(lambda: s3_client(args.region))

    def s3(bucket: str) -> ObjectStore:
        return S3Store(bucket, job_client if job_client is not None and bucket == args.bucket else instance_client(),
                       compiled=True)
    return s3, Ec2Metadata(args.metadata_url or env(ENDPOINT_ENV)), ecr_login(), secrets


def command_power_off(command: str) -> Callable[[], None]:
    argv = shlex.split(command)

    def power_off() -> None:
        subprocess.run(argv, check=False, timeout=60)

    return power_off


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s jobplane-agent %(levelname)s %(message)s")
    for noisy in ("botocore", "boto3", "urllib3", "google"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    try:
        config = AgentConfig(ml_root=args.ml_root.resolve(), job_id=args.job, attempt=args.attempt,
                             log_interval=args.log_interval, heartbeat_interval=args.heartbeat_interval,
                             checkpoint_interval=args.checkpoint_interval, poll_interval=args.poll_interval,
                             stop_grace=args.stop_grace, cluster_timeout=args.cluster_timeout,
                             checkpoint_settle=args.checkpoint_settle, checkpoint_freeze=args.checkpoint_freeze)
    except ValueError as exc:
        raise SystemExit(f"jobplane.agent: {exc}") from None
    stores, metadata, registry_login, secrets = cloud_adapters(args)
    registry = RootedStore(stores(args.bucket), args.root)
    agent = Agent(registry, metadata, config, environ=os.environ, power_off=command_power_off(args.poweroff_cmd),
                  stores=stores, console=sys.stdout.buffer, registry_login=registry_login, secrets=secrets)
    for sig in (signal.SIGTERM, signal.SIGINT):  # the VM shutting down (or ^C): stop the job, sync, report
        signal.signal(sig, agent.on_signal)
    return agent.run()
