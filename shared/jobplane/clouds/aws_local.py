"""The EC2, SSM and S3 calls the local cloud makes against moto, beyond the Compute protocol.

It provisions the registry bucket and a VPC on loopback (so every address an instance gets is on this
machine), registers the local images and publishes the public SSM parameters the image aliases resolve
through, watches every managed instance in any state (the runner must see terminations), reads user-data,
and plays the user or EC2 itself in scenarios (an untagged instance). Job notifications go to an SNS topic
in moto with an SQS queue subscribed, which the local cloud reads to show them on its console.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import ipaddress
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config

from jobplane.clouds.base import TAG_JOB_ID, TAG_MANAGED

# The local cloud's VPC: inside 127.0.0.0/8, which Linux routes entirely to lo, so a private IP handed to an
# instance (MASTER_ADDR, SM_HOSTS, IMDS local-ipv4) is an address of this machine. EC2 takes /16 to /28
# VPCs; one /24 subnet per zone.
LOOPBACK_VPC = "127.100.0.0/16"
VPC_NAME = "jobplane-local-loopback"
LOCAL_AGENT = "jobplane-local-cloud"  # in the User-Agent of the local cloud's own calls (jobplane.local.api_faults)
STATES = ("pending", "running", "shutting-down", "terminated", "stopping", "stopped")  # an EC2 instance's, all of them


@dataclass(frozen=True)
class RawInstance:
    id: str
    state: str  # pending | running | shutting-down | terminated | stopping | stopped
    launch_index: int
    tags: dict[str, str]
    instance_type: str
    zone: str
    spot: bool
    private_ip: str | None
    image_id: str = ""
    public_ip: str | None = None

    @property
    def managed(self) -> bool:
        return self.tags.get(TAG_MANAGED) == "true"


_role_sessions: dict[str, boto3.Session] = {}


def share_botocore_loader() -> None:
    """One botocore loader for every session of this process; idempotent. A new session parses botocore's endpoints
    and each service's model again (EC2's is megabytes of JSON): the local cloud makes one per function role (each
    signs as its own), moto's server one per service's region list, about a CPU second each."""
    import botocore.session

    if not hasattr(botocore.session.create_loader, "cache_info"):  # once
        botocore.session.create_loader = functools.lru_cache(maxsize=None)(botocore.session.create_loader)


@contextlib.contextmanager
def default_session(credentials: Mapping[str, str]) -> Iterator[None]:
    """boto3's default session signs with these credentials (AWS_ACCESS_KEY_ID, ...) meanwhile: a client made then
    (boto3.client) is theirs. botocore keeps the credentials it first resolved from the environment, so the local
    cloud's functions, each under its own role in one process, need a session each."""
    key = credentials.get("AWS_ACCESS_KEY_ID")
    if not key:
        yield
        return
    if key not in _role_sessions:
        share_botocore_loader()
        _role_sessions[key] = boto3.Session(aws_access_key_id=key,
                                            aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
                                            aws_session_token=credentials.get("AWS_SESSION_TOKEN"))
    saved = boto3.DEFAULT_SESSION
    boto3.DEFAULT_SESSION = _role_sessions[key]
    try:
        yield
    finally:
        boto3.DEFAULT_SESSION = saved


class LocalAws:
    def __init__(self, region: str, endpoint: str | None = None, credentials: dict[str, str] | None = None) -> None:
        """endpoint / credentials: the moto server's (else the environment's), explicit so a caller need not
        touch os.environ. credentials use the AWS_* variable names."""
        self.region = region
        share_botocore_loader()
        creds = {"aws_access_key_id": (credentials or {}).get("AWS_ACCESS_KEY_ID"),
                 "aws_secret_access_key": (credentials or {}).get("AWS_SECRET_ACCESS_KEY"),
                 "aws_session_token": (credentials or {}).get("AWS_SESSION_TOKEN")}
        # the local cloud's own calls (it plays AWS and the user here) name themselves: `local up --faults` spares them
        config = Config(user_agent_extra=LOCAL_AGENT)
        self.ec2: Any = boto3.client("ec2", region_name=region, endpoint_url=endpoint, config=config, **creds)
        self.s3: Any = boto3.client("s3", region_name=region, endpoint_url=endpoint, config=config, **creds)
        self.ssm: Any = boto3.client("ssm", region_name=region, endpoint_url=endpoint, config=config, **creds)
        self.sns: Any = boto3.client("sns", region_name=region, endpoint_url=endpoint, config=config, **creds)
        self.sqs: Any = boto3.client("sqs", region_name=region, endpoint_url=endpoint, config=config, **creds)
        self.iam: Any = boto3.client("iam", region_name=region, endpoint_url=endpoint, config=config, **creds)
        self.sts: Any = boto3.client("sts", region_name=region, endpoint_url=endpoint, config=config, **creds)

    def create_role(self, name: str, trust: dict[str, Any], policy: dict[str, Any],
                    tags: Mapping[str, str] | None = None) -> str:
        """A role with one inline policy (both IAM JSON, jobplane.vending.aws_iam) and these tags; returns its ARN.
        Made again, it keeps the role and replaces the policy."""
        tagged = [{"Key": k, "Value": v} for k, v in (tags or {}).items()]
        try:
            arn = str(self.iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust),
                                           Tags=tagged)["Role"]["Arn"])
        except self.iam.exceptions.EntityAlreadyExistsException:
            arn = str(self.iam.get_role(RoleName=name)["Role"]["Arn"])
        self.iam.put_role_policy(RoleName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps(policy))
        return arn

    def role_session(self, role_arn: str, session_name: str, seconds: int = 3600) -> dict[str, Any]:
        """STS credentials of the role ({AccessKeyId, SecretAccessKey, SessionToken, Expiration (datetime)}), as
        EC2 gets them for an instance profile (the session named after the instance)."""
        return dict(self.sts.assume_role(RoleArn=role_arn, RoleSessionName=session_name,
                                         DurationSeconds=seconds)["Credentials"])

    def notification_inbox(self, name: str = "jobplane-jobs") -> tuple[str, str]:
        """(topic ARN, queue URL): the deployment's notification topic and a queue subscribed to it."""
        topic = str(self.sns.create_topic(Name=name)["TopicArn"])
        url = str(self.sqs.create_queue(QueueName=f"{name}-console")["QueueUrl"])
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
        return topic, url

    def notifications(self, queue_url: str) -> list[dict[str, Any]]:
        """The notices delivered to the queue since the last call (their JSON data), oldest first."""
        out: list[dict[str, Any]] = []
        while batch := self.sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
            for message in batch:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        return out

    def create_bucket(self, name: str) -> None:
        with contextlib.suppress(self.s3.exceptions.BucketAlreadyOwnedByYou):
            self.s3.create_bucket(Bucket=name)

    def register_image(self, name: str = "jobplane-local", architecture: str = "x86_64") -> str:
        """An AMI of our own for RunInstances (moto accepts any id; a registered one is what EC2 needs)."""
        found = self.ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [name]}])["Images"]
        if found:
            return str(found[0]["ImageId"])
        return str(self.ec2.register_image(
            Name=name, Architecture=architecture, RootDeviceName="/dev/xvda", VirtualizationType="hvm",
            BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 8}}])["ImageId"])

    def publish_image_parameter(self, name: str, image_id: str) -> None:
        """What a vendor does for its public images: the parameter names the current AMI (moto lets the
        local cloud write /aws/service/ names, see jobplane.local.moto_server)."""
        self.ssm.put_parameter(Name=name, Value=image_id, Type="String", DataType="aws:ec2:image", Overwrite=True)

    def loopback_subnets(self) -> list[str]:
        """Subnet ids of the loopback VPC, one per zone in zone order; the VPC is made on the first call."""
        vpcs = self.ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": [VPC_NAME]}])["Vpcs"]
        if vpcs:
            vpc = vpcs[0]["VpcId"]
            found = self.ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
            return [str(sn["SubnetId"]) for sn in sorted(found, key=lambda sn: sn["AvailabilityZone"])]
        vpc = self.ec2.create_vpc(CidrBlock=LOOPBACK_VPC, TagSpecifications=[
            {"ResourceType": "vpc", "Tags": [{"Key": "Name", "Value": VPC_NAME}]}])["Vpc"]["VpcId"]
        zones = sorted(z["ZoneName"] for z in self.ec2.describe_availability_zones()["AvailabilityZones"])
        blocks = ipaddress.ip_network(LOOPBACK_VPC).subnets(new_prefix=24)
        next(blocks)  # leave 127.100.0.x out: one subnet per zone from 127.100.1.0/24 on
        return [str(self.ec2.create_subnet(VpcId=vpc, CidrBlock=str(next(blocks)), AvailabilityZone=zone)
                    ["Subnet"]["SubnetId"]) for zone in zones]

    def instances(self, managed_only: bool = True, terminated: bool = True) -> list[RawInstance]:
        """terminated=False leaves out the instances EC2 (and moto) keep listing after they end: a module's scenarios
        leave dozens, each some milliseconds of every DescribeInstances a tick makes."""
        filters = [{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}] if managed_only else []
        if not terminated:
            filters.append({"Name": "instance-state-name", "Values": [s for s in STATES if s != "terminated"]})
        out: list[RawInstance] = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for res in page["Reservations"]:
                for raw in res["Instances"]:
                    out.append(RawInstance(
                        id=raw["InstanceId"], state=raw["State"]["Name"],
                        launch_index=int(raw.get("AmiLaunchIndex", 0)),
                        tags={t["Key"]: t["Value"] for t in raw.get("Tags", [])},
                        instance_type=raw.get("InstanceType", "t3.micro"),
                        zone=raw.get("Placement", {}).get("AvailabilityZone", f"{self.region}a"),
                        spot=raw.get("InstanceLifecycle") == "spot", private_ip=raw.get("PrivateIpAddress"),
                        image_id=raw.get("ImageId", ""),
                        public_ip=raw.get("PublicIpAddress")))
        return out

    def user_data(self, instance_id: str) -> str:
        attr = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        value = attr.get("UserData", {}).get("Value")
        return base64.b64decode(value).decode() if value else ""

    def shutdown_behavior(self, instance_id: str) -> str:
        attr = self.ec2.describe_instance_attribute(InstanceId=instance_id,
                                                    Attribute="instanceInitiatedShutdownBehavior")
        return str(attr.get("InstanceInitiatedShutdownBehavior", {}).get("Value") or "stop")

    def terminate(self, instance_ids: list[str]) -> None:
        if instance_ids:
            self.ec2.terminate_instances(InstanceIds=instance_ids)

    def stop(self, instance_ids: list[str]) -> None:
        if instance_ids:
            self.ec2.stop_instances(InstanceIds=instance_ids)

    def run(self, *, managed: bool, job_id: str | None = None, attempt: int | None = None,
            user_data: str = "", instance_type: str = "t3.micro") -> str:
        """One instance the way a user (not the launcher) would start it; tags say who owns it."""
        tags = {TAG_MANAGED: "true"} if managed else {"Name": "not-jobplane"}
        if job_id:
            tags[TAG_JOB_ID] = job_id
        if attempt is not None:
            tags["jobplane:attempt"] = str(attempt)
        params: dict[str, Any] = {
            "ImageId": self.register_image(), "InstanceType": instance_type, "MinCount": 1, "MaxCount": 1,
            "InstanceInitiatedShutdownBehavior": "terminate", "SubnetId": self.loopback_subnets()[0],
            "TagSpecifications": [{"ResourceType": "instance",
                                   "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        }
        if user_data:
            params["UserData"] = user_data
        return str(self.ec2.run_instances(**params)["Instances"][0]["InstanceId"])
