"""The local AWS cloud: moto's server for S3, EC2 and SSM (in its own process), each managed EC2 instance a
local process tree (jobplane.local.ec2_runner), the Lambda handlers invoked in this process with the stack's
EventBridge routes (jobplane.local.triggers). Instances live in a VPC inside 127.0.0.0/8.

The image aliases resolve through the same public SSM parameters as on AWS: the local cloud plays their
publishers, so Canonical's Ubuntu parameters name an AMI that runs on this machine and Debian's name the
stock Debian 12 image when it is built. The Debian 12 + podman image, when built, has a parameter of its own
(PODMAN_PARAMETER: a spec says `image: resolve:ssm:/jobplane/local/debian-12-podman`).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jobplane.boot import bundling
from jobplane.local import rootfs
from jobplane.local.changes import HttpCounts
from jobplane.local.cloud import LocalCloud, ServiceProcess
from jobplane.local.moto_server import CONSOLES_ENV
from jobplane.local.triggers import Functions, LambdaFunctions
from jobplane.model import images
from jobplane.store.registry import Registry

log = logging.getLogger("local-cloud")

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's
DATA_BUCKET = "jobplane-local-data"  # the platform's input data: read-only to jobs, as a data bucket on AWS
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}
PODMAN_PARAMETER = "/jobplane/local/debian-12-podman"
MEMBER_SESSION_S = 12 * 3600  # a team member's session: a working day


class AwsLocalCloud(LocalCloud):
    cloud = "aws"
    hidden_env = ("GOOGLE_", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST")
    instance_areas = ("ec2",)  # moto's counts (jobplane.local.moto_server.CountChanges)
    notice_areas = ("sns", "sqs")

    def __init__(self, state_dir: Path, port: int = 0, tick: float = 1.0, **kwargs: Any) -> None:
        super().__init__(state_dir, port, tick, **kwargs)
        faults = ("--faults", f"{self.faults.rate}:{self.faults.seed}") if self.faults else ()
        self.moto = ServiceProcess("jobplane.local.moto_server", port, *faults)
        self.aws: Any = None
        self.inbox = ""  # the SQS queue subscribed to the notification topic
        self.vend_url: Any = None  # the vending function's URL (jobplane.local.function_url)
        self.vm_role_arn: str | None = None
        self.sessions: FunctionSessions | None = None

    @property
    def exports(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.moto.url, "JOBPLANE_BUCKET": f"s3://{self.bucket}", "AWS_REGION": REGION,
                "AWS_DEFAULT_REGION": REGION, **CREDENTIALS}

    def start_services(self) -> None:
        # GetConsoleOutput answers from the instance runner's console logs
        self.moto.start(self.state_dir / "moto.log", env={CONSOLES_ENV: str(self.state_dir / "instances")})
        self.watch.read = HttpCounts(self.moto.url)

    def stop_services(self) -> None:
        if self.vend_url is not None:
            self.vend_url.stop()
        self.moto.stop()

    def services(self) -> dict[str, int | None]:
        return {"moto": self.moto.proc.pid if self.moto.proc else None}

    def provision(self) -> tuple[Registry, str, dict[str, Path]]:
        os.environ.update({"POWERTOOLS_SERVICE_NAME": "jobplane-local", "POWERTOOLS_METRICS_NAMESPACE": "jobplane"})
        os.environ.pop("AWS_EC2_METADATA_DISABLED", None)
        from jobplane.clouds.aws_local import LocalAws
        from jobplane.clouds.s3 import S3Store

        aws = self.aws = LocalAws(REGION)
        aws.create_bucket(self.bucket)
        aws.create_bucket(DATA_BUCKET)
        topic, self.inbox = aws.notification_inbox()
        os.environ["JOBPLANE_NOTIFY_TOPIC"] = topic  # the functions publish job notifications there
        placement = f"aws:\n  subnets: [{', '.join(aws.loopback_subnets())}]"
        self._identities(aws, topic)
        return Registry(S3Store(self.bucket)), placement, publish_images(aws)

    def _identities(self, aws: Any, topic: str) -> None:
        """The stack's roles in moto (the functions' as `cdk synth` defines them, each function run under its own)
        and the vending function behind its URL; the functions find both in their environment, as on AWS."""
        from jobplane.local.function_url import FunctionUrl

        roles = create_roles(aws, self.bucket, (DATA_BUCKET,))
        self.sessions = FunctionSessions(aws, function_roles(aws, self.bucket, roles, topic))
        self.vm_role_arn = roles.vm
        self.vend_url = FunctionUrl(lambda event: self.functions.invoke("vend", event) if self.functions else None,
                                    faults=self.faults)
        self.vend_url.start()
        os.environ.update({"JOBPLANE_VEND_URL": self.vend_url.url, **roles.env()})

    def make_functions(self, log_stream: IO[str]) -> Functions:
        return LambdaFunctions(self.bucket, REGION, log_stream, on_result=self.console.invoked,
                               credentials=self.sessions.env if self.sessions else None)

    def notifications(self) -> list[dict[str, Any]]:
        return list(self.aws.notifications(self.inbox))

    def make_runner(self, instance_env: dict[str, str], images: dict[str, Path]) -> Any:
        from jobplane.local.ec2_runner import Ec2Runner

        functions = self.functions
        assert isinstance(functions, LambdaFunctions)

        def ec2_event(detail: dict[str, Any]) -> None:
            """From the runner: shown on the console, then delivered as EventBridge would."""
            self.console.ec2(detail["detail-type"], detail["detail"])
            functions.ec2_event(detail)

        return Ec2Runner(self.aws, self.state_dir, instance_env, self.cloud_id, ec2_event, images,
                         vm_role_arn=self.vm_role_arn)

    def instance_by_hand(self, managed: bool, job_id: str | None, attempt: int | None, user_data: str) -> str:
        return str(self.aws.run(managed=managed, job_id=job_id, attempt=attempt, user_data=user_data))

    def member_exports(self, owner: str) -> dict[str, str]:
        """A member of `owner`'s team: the credentials of a session of a role tagged jobplane-owner=<owner> that
        holds the stack's submitter policy (jobplane.vending.aws_iam.submitter_statements, as `cdk deploy` makes
        it), which the local moto enforces as IAM does; and JOBPLANE_OWNER, which `jobplane submit` drops under."""
        from jobplane.vending import aws_iam

        role = self.aws.create_role(
            f"jobplane-team-{owner}", aws_iam.trust({"AWS": f"arn:aws:iam::{ACCOUNT}:root"}),
            aws_iam.document(aws_iam.submitter_statements(aws_iam.bucket_arn("aws", self.bucket), "")),
            tags={aws_iam.OWNER_TAG: owner})
        session = self.aws.role_session(role, f"member-of-{owner}", MEMBER_SESSION_S)
        return {**self.exports, "AWS_ACCESS_KEY_ID": session["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": session["SecretAccessKey"], "AWS_SESSION_TOKEN": session["SessionToken"],
                "JOBPLANE_OWNER": owner}


@dataclass(frozen=True)
class Roles:
    vm: str
    job: str

    def env(self) -> dict[str, str]:
        """What the vending function reads (functions/aws/vend.py)."""
        return {"JOBPLANE_VM_ROLE_ARN": self.vm, "JOBPLANE_JOB_ROLE_ARN": self.job}


def create_roles(aws: Any, bucket: str, data_buckets: tuple[str, ...] = ()) -> Roles:
    """The stack's three roles in moto, from the policies the CDK deploys (jobplane.vending.aws_iam): the VM role
    (EC2's, may only ask the vending function), the job role (trusted only by the vending function's role) and
    that."""
    from jobplane.vending import aws_iam

    aws_iam.check_fits(bucket, "")  # as the CDK app does: every job's credentials can be vended
    registry = aws_iam.bucket_arn("aws", bucket)
    vend_fn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:jobplane-vend"
    vend_role = aws.create_role("jobplane-vend", aws_iam.trust({"Service": "lambda.amazonaws.com"}),
                                aws_iam.document(aws_iam.vend_role_statements(
                                    f"arn:aws:iam::{ACCOUNT}:role/jobplane-job", registry, "")))
    job = aws.create_role("jobplane-job", aws_iam.trust({"AWS": vend_role}),
                          aws_iam.document(aws_iam.job_role_statements(registry, "")))
    vm = aws.create_role("jobplane-vm", aws_iam.trust({"Service": "ec2.amazonaws.com"}),
                         aws_iam.document(aws_iam.vm_role_statements(vend_fn, "aws", data_buckets)))
    return Roles(vm, job)


def function_roles(aws: Any, bucket: str, roles: Roles, topic: str | None) -> dict[str, str]:
    """Each function's role in moto with its role's statements from the synthesized template (jobplane.local.stack_iam),
    resolved to this cloud's bucket, roles, topic, subnets and their VPC's default security group; the vend role is
    the one the job role trusts (create_roles), its policy now the template's. Returns function -> role ARN."""
    from jobplane.local import stack_iam
    from jobplane.vending import aws_iam

    subnets = aws.loopback_subnets()
    vpc = aws.ec2.describe_subnets(SubnetIds=subnets[:1])["Subnets"][0]["VpcId"]
    group = aws.ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                      {"Name": "group-name", "Values": ["default"]}])
    local = stack_iam.Local(bucket, REGION, ACCOUNT, {"VmRole": roles.vm, "JobRole": roles.job}, topic, subnets,
                            group["SecurityGroups"][0]["GroupId"])
    out = {}
    for name, docs in stack_iam.documents(stack_iam.load(), local).items():
        statements = [st for doc in docs for st in doc["Statement"]]
        out[name] = aws.create_role(f"jobplane-{name.replace('_', '-')}",
                                    aws_iam.trust({"Service": "lambda.amazonaws.com"}), aws_iam.document(statements))
    return out


class FunctionSessions:
    """A session of each function's role, as Lambda gives a function its role's credentials in its environment;
    renewed before it expires."""

    LIFE_S = 3600
    RENEW_S = 3000

    def __init__(self, aws: Any, roles: Mapping[str, str], clock: Callable[[], float] = time.monotonic) -> None:
        self.aws, self.roles, self.clock = aws, dict(roles), clock
        self.sessions: dict[str, tuple[float, dict[str, str]]] = {}
        self.lock = threading.Lock()

    def env(self, function: str) -> dict[str, str]:
        """AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN of the function's role."""
        with self.lock:
            made, env = self.sessions.get(function, (-math.inf, {}))  # monotonic() may start near 0 (at boot)
            if self.clock() - made > self.RENEW_S:
                creds = self.aws.role_session(self.roles[function], f"jobplane-{function}", self.LIFE_S)
                env = {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
                       "AWS_SESSION_TOKEN": creds["SessionToken"]}
                self.sessions[function] = (self.clock(), env)
            return env


def publish_images(aws: Any) -> dict[str, Path]:
    """Register the local images and publish the vendors' parameters for them; returns AMI -> root fs."""
    arch = bundling.host_architecture()
    ec2_arch = "arm64" if arch == images.AARCH64 else "x86_64"
    host = aws.register_image("jobplane-local", ec2_arch)
    for alias in ("ubuntu-24.04", "ubuntu-24.04-gpu"):  # this machine stands in for Ubuntu
        aws.publish_image_parameter(images.ALIASES[alias].aws[arch], host)
    problem = rootfs.image_problem()
    if problem:
        log.warning("image debian-12 is not available in this local cloud: %s", problem)
        return {}
    debian = aws.register_image("debian-12-local", ec2_arch)
    aws.publish_image_parameter(images.ALIASES["debian-12"].aws[arch], debian)
    if problem := rootfs.podman_image_problem():
        log.warning("image debian-12-podman is not available in this local cloud: %s", problem)
        return {debian: rootfs.image_dir()}
    podman = aws.register_image("debian-12-podman-local", ec2_arch)
    aws.publish_image_parameter(PODMAN_PARAMETER, podman)
    return {debian: rootfs.image_dir(), podman: rootfs.podman_image_dir()}
