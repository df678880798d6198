"""IAM statements of the control plane. Ownership is enforced here as well as in code: nothing can be
launched without the managed tag and this deployment's tag in the request, and nothing without both can be
terminated, so a second deployment in the account cannot end this one's VMs even through a bug."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3

from jobplane.clouds.base import TAG_DEPLOYMENT, TAG_MANAGED
from jobplane.vending import aws_iam


def ours(deployment: str, kind: str = "ResourceTag") -> dict[str, str]:
    """The condition on both ownership tags (kind: ResourceTag on an instance, RequestTag in a launch)."""
    return {f"aws:{kind}/{TAG_MANAGED}": "true", f"aws:{kind}/{TAG_DEPLOYMENT}": deployment}


# Registry areas an agent reads and writes (the job role's grants): jobplane.vending.aws_iam, shared with the
# local cloud.
AGENT_AREAS = tuple(dict.fromkeys(aws_iam.AGENT_READ + aws_iam.AGENT_WRITE + aws_iam.AGENT_PRUNE + aws_iam.TAGGED))
# Why each EC2 resource wildcard in the launch/terminate statements cannot be narrower.
EC2_WILDCARDS = {
    "instance/*": "Instance ids exist only after launch; RunInstances needs jobplane:managed=true in the request "
                  "and TerminateInstances needs it on the instance (conditions on the same statements).",
    "volume/*": "Root volumes are created by RunInstances; the request must tag them jobplane:managed=true.",
    "network-interface/*": "RunInstances creates each VM's primary ENI; subnet and security group are pinned to "
                           "the stack's own.",
    "spot-instances-request/*": "RunInstances creates the Spot request itself; its id is unknown beforehand.",
    "key-pair/*": "The policy may name any key pair (aws.key_name) for SSH debugging.",
    "image/*": "AMIs come from the job spec or the policy (Amazon, Marketplace or own images).",
}


def _ec2_arn(resource: str, account: bool = True) -> str:
    # AMIs belong to other accounts (Amazon, Marketplace): their ARNs have an empty account field.
    owner = cdk.Aws.ACCOUNT_ID if account else ""
    return f"arn:{cdk.Aws.PARTITION}:ec2:{cdk.Aws.REGION}:{owner}:{resource}"


def launch_statements(vm_role: iam.IRole, subnets: Sequence[str], security_group: str,
                      placement_group: str, deployment: str) -> list[iam.PolicyStatement]:
    """RunInstances only with jobplane:managed=true and this deployment's tag in the request; tags only at
    launch; PassRole: VM role."""
    return [
        iam.PolicyStatement(
            sid="RunManagedInstancesOnly",
            actions=["ec2:RunInstances"],
            resources=[_ec2_arn("instance/*"), _ec2_arn("volume/*")],
            conditions={"StringEquals": ours(deployment, "RequestTag")},
        ),
        iam.PolicyStatement(
            sid="RunInstancesWithTheStacksNetworkAndAnyImage",
            actions=["ec2:RunInstances"],
            resources=[
                *(_ec2_arn(f"subnet/{s}") for s in subnets),
                _ec2_arn(f"security-group/{security_group}"),
                _ec2_arn(f"placement-group/{placement_group}"),
                _ec2_arn("network-interface/*"),
                _ec2_arn("spot-instances-request/*"),
                _ec2_arn("key-pair/*"),
                _ec2_arn("image/*", account=False),
            ],
        ),
        iam.PolicyStatement(
            sid="TagOnlyWhileLaunching",
            actions=["ec2:CreateTags"],
            resources=[_ec2_arn("instance/*"), _ec2_arn("volume/*")],
            conditions={"StringEquals": {"ec2:CreateAction": "RunInstances", **ours(deployment, "RequestTag")}},
        ),
        iam.PolicyStatement(
            sid="PassOnlyTheVmRole",
            actions=["iam:PassRole"],
            resources=[vm_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
        ),
    ]


# Image aliases resolve through SSM parameters (jobplane.model.images): the vendors' public ones, and a team's own
# given as resolve:ssm:<name>. Both are read-only; public parameters have an empty account field.
IMAGE_PARAMETERS = {
    "arn:<AWS::Partition>:ssm:<AWS::Region>::parameter/aws/service/*":
        "The public image parameters Canonical, Debian and the AWS Deep Learning AMIs maintain (read-only).",
    "arn:<AWS::Partition>:ssm:<AWS::Region>:<AWS::AccountId>:parameter/*":
        "A spec or the policy may name any of the account's own parameters as resolve:ssm:<name> (read-only).",
}


def image_parameters_statement() -> iam.PolicyStatement:
    """Read the SSM parameters image aliases and resolve:ssm: images name (the launcher, before RunInstances)."""
    base = f"arn:{cdk.Aws.PARTITION}:ssm:{cdk.Aws.REGION}"
    return iam.PolicyStatement(
        sid="ReadImageParameters",
        actions=["ssm:GetParameter", "ssm:GetParameters"],
        resources=[f"{base}::parameter/aws/service/*", f"{base}:{cdk.Aws.ACCOUNT_ID}:parameter/*"],
    )


def spot_price_statement() -> iam.PolicyStatement:
    """The Spot price in effect when a launcher starts Spot VMs, for the job's cost (jobplane.views.cost). Like every
    EC2 Describe* call it supports no resource-level permissions."""
    return iam.PolicyStatement(sid="ReadSpotPricesAtLaunch", actions=["ec2:DescribeSpotPriceHistory"],
                               resources=["*"])


def terminate_statements(deployment: str) -> list[iam.PolicyStatement]:
    """Terminate (and read termination protection and the console output of) instances carrying
    jobplane:managed=true and this deployment's tag only; the console output of a VM whose agent never
    started goes to the job's logs."""
    return [
        iam.PolicyStatement(
            sid="TerminateManagedInstancesOnly",
            actions=["ec2:TerminateInstances", "ec2:DescribeInstanceAttribute", "ec2:GetConsoleOutput"],
            resources=[_ec2_arn("instance/*")],
            conditions={"StringEquals": ours(deployment)},
        ),
    ]


def describe_statement() -> iam.PolicyStatement:
    # EC2 Describe* calls support no resource-level permissions: "*" is the only possible resource.
    return iam.PolicyStatement(
        sid="DescribeInstancesImagesSubnets",
        actions=["ec2:DescribeInstances", "ec2:DescribeImages", "ec2:DescribeSubnets"],
        resources=["*"],
    )


# A team member's policy (jobplane.vending.aws_iam, shared with the local cloud): its tag names its team.
OWNER_TAG = aws_iam.OWNER_TAG
SUBMITTER_PATTERNS = aws_iam.SUBMITTER_WRITE + aws_iam.SUBMITTER_READ + aws_iam.SUBMITTER_DENIED
SECRET_PARAMETERS = aws_iam.SECRET_PARAMETERS
SECRET_MEMBER_PATTERNS = aws_iam.SECRET_MEMBER_PATTERNS


def submitter_statements(bucket: s3.IBucket, prefix: str) -> list[iam.PolicyStatement]:
    """What a team member may do: its own team's drops, code and cancel requests; every job's record and its own
    team's data (aws_iam.submitter_statements)."""
    return _statements(aws_iam.submitter_statements(bucket.bucket_arn, prefix))


def _statements(documents: Sequence[dict[str, Any]]) -> list[iam.PolicyStatement]:
    return [iam.PolicyStatement.from_json(statement) for statement in documents]


def vm_statements(vend_function: lambda_.IFunction, data_buckets: Sequence[str],
                  container_repositories: Sequence[str] = (), ssh: bool = False) -> list[iam.PolicyStatement]:
    """What a VM's own identity may do: ask the vending function, through its IAM-authenticated URL only, for its
    job's credentials, read the input-data buckets and pull job containers from the ECR repositories named.
    Nothing in the registry: the bootstrap fetches the agent through URLs the launcher presigned, and the agent
    works with its job's vended credentials."""
    arns = [name if name.startswith("arn:") else
            f"arn:{cdk.Aws.PARTITION}:ecr:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:repository/{name}"
            for name in container_repositories]
    return _statements(aws_iam.vm_role_statements(vend_function.function_arn, cdk.Aws.PARTITION, data_buckets, arns,
                                                  ssh))


def job_statements(bucket: s3.IBucket, prefix: str) -> list[iam.PolicyStatement]:
    """The job role: what any job's agent may do (no EC2, no IAM); the vending function assumes it with a session
    policy naming one job's keys, so a session may do only what both allow.

    ListBucket is on the whole registry bucket here, and on the job's own prefixes in the session policy (S3
    then answers 403 instead of 404 for a missing key: jobplane.clouds.aws_vend reads that as missing)."""
    return _statements(aws_iam.job_role_statements(bucket.bucket_arn, prefix))


def vend_statements(job_role: iam.IRole, bucket: s3.IBucket, prefix: str) -> list[iam.PolicyStatement]:
    """The vending function: assume the job role, read job records, see instances' tags."""
    return _statements(aws_iam.vend_role_statements(job_role.role_arn, bucket.bucket_arn, prefix))
