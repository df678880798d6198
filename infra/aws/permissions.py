"""IAM statements of the control plane. Ownership is enforced here as well as in code: nothing can be
launched without the managed tag and this deployment's tag in the request, and nothing without both can be
terminated, so a second deployment in the account cannot end this one's VMs even through a bug."""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from jobplane.clouds.base import TAG_DEPLOYMENT, TAG_MANAGED


def ours(deployment: str, kind: str = "ResourceTag") -> dict[str, str]:
    """The condition on both ownership tags (kind: ResourceTag on an instance, RequestTag in a launch)."""
    return {f"aws:{kind}/{TAG_MANAGED}": "true", f"aws:{kind}/{TAG_DEPLOYMENT}": deployment}


# Registry areas a VM reads and writes (relative to the registry root).
VM_READ = ("jobs/*/job.json", "jobs/*/code/*", "code/*", "jobs/*/checkpoints/*", "jobs/*/attempts/*/cluster.json",
           "jobs/*/control/stop")
VM_WRITE = ("heartbeats/*", "jobs/*/logs/*", "jobs/*/metrics/*", "jobs/*/checkpoints/*", "jobs/*/artifacts/*",
            "jobs/*/attempts/*/nodes/*/exit.json", "preempted-jobs/*")
# Synced directories: after each manifest the agent deletes the objects it no longer names (an old
# checkpoint the training code removed) and aborts a multipart upload it gave up on.
VM_PRUNE = ("jobs/*/checkpoints/*", "jobs/*/artifacts/*")
TAGGED = ("jobs/*/logs/*", "jobs/*/metrics/*")  # the chunks the log lifecycle rule expires, by their tag
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


# Image aliases resolve through SSM parameters (jobplane.images): the vendors' public ones, and a team's own
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
    """The Spot price in effect when a launcher starts Spot VMs, for the job's cost (jobplane.cost). Like every
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


# The principal tag naming a submitter's owner (a team): IAM substitutes it into the resource, so a principal
# writes drops and code only under its own queue/<owner>/ and code/<owner>/. A principal without the tag
# matches nothing. Tags come from the IAM user or role, or from the session (SSO, SAML, OIDC session tags).
OWNER_TAG = "jobplane-owner"
OWNER = f"${{aws:PrincipalTag/{OWNER_TAG}}}"
SUBMITTER_WRITE = (f"queue/{OWNER}/*", f"code/{OWNER}/*")
SUBMITTER_READ = ("jobs/*", "queue/*", "rejected/*")


def submitter_statements(bucket: s3.IBucket, prefix: str) -> list[iam.PolicyStatement]:
    """What `jobplane submit`, `ls`, `describe`, `logs`, `wait` and `cost` need, and writes only in the principal's
    own owner folders (create and overwrite their own drops and code; nothing else in the registry)."""
    def objects(*patterns: str) -> list[str]:
        return [bucket.arn_for_objects(prefix + p) for p in patterns]

    return [
        iam.PolicyStatement(sid="SubmitOnlyUnderTheOwnersFolders", actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                            resources=objects(*SUBMITTER_WRITE)),
        iam.PolicyStatement(sid="ReadJobsDropsAndRejections", actions=["s3:GetObject"],
                            resources=objects(*SUBMITTER_READ)),
        iam.PolicyStatement(sid="ListRegistryKeys", actions=["s3:ListBucket"], resources=[bucket.bucket_arn]),
        # EC2 Describe* calls support no resource-level permissions: "*" is the only possible resource.
        iam.PolicyStatement(sid="DescribeJobInstances", actions=["ec2:DescribeInstances"], resources=["*"]),
    ]


def vm_statements(bucket: s3.IBucket, prefix: str, data_buckets: Sequence[str]) -> list[iam.PolicyStatement]:
    """What the agent on a VM may do: read its job's inputs, write its own facts. No EC2, no IAM.

    ListBucket is on the whole registry bucket: without it S3 answers 403 instead of 404 for keys the agent
    polls before they exist (cluster.json, control/stop), and a prefix-conditioned grant does not count for
    that. It exposes key names, not contents.
    """
    def objects(*patterns: str) -> list[str]:
        return [bucket.arn_for_objects(prefix + p) for p in patterns]

    statements = [
        iam.PolicyStatement(
            sid="ReadJobRecordCodeCheckpointsClusterAndStop",
            actions=["s3:GetObject"],
            resources=objects(*VM_READ),
        ),
        iam.PolicyStatement(
            sid="WriteHeartbeatsLogsMetricsCheckpointsArtifactsExitReportsPreemptedMarker",
            actions=["s3:PutObject"],
            resources=objects(*VM_WRITE),
        ),
        iam.PolicyStatement(
            sid="PruneSyncedCheckpointsAndArtifacts",
            actions=["s3:DeleteObject", "s3:AbortMultipartUpload"],
            resources=objects(*VM_PRUNE),
        ),
        iam.PolicyStatement(  # a PutObject carrying tags needs this too; only log and metrics chunks are tagged
            sid="TagLogChunksForTheirLifecycleRule",
            actions=["s3:PutObjectTagging"],
            resources=objects(*TAGGED),
        ),
        iam.PolicyStatement(sid="ListRegistryKeys", actions=["s3:ListBucket"], resources=[bucket.bucket_arn]),
    ]
    if data_buckets:
        arns = [f"arn:{cdk.Aws.PARTITION}:s3:::{name}" for name in data_buckets]
        statements.append(iam.PolicyStatement(
            sid="ReadInputDataBuckets", actions=["s3:GetObject", "s3:ListBucket"],
            resources=[*arns, *(f"{a}/*" for a in arns)],
        ))
    return statements
