"""The IAM policy documents of jobplane's AWS identities, as plain JSON (dicts): the CDK stack
(infra/aws/permissions.py) and the local cloud (jobplane.local.aws) build their roles from these, and the vending
function narrows the job role to one job with `session_policy`.

Three identities reach the registry's job keys:
- the VM role (instance profile): may only ask the vending function for its job's credentials, and read the
  input data buckets;
- the job role: what any agent may do in the registry (today's grants), assumed only by the vending function,
  always with a session policy naming one job's keys (the session may do what both allow);
- the vending function's role: assume the job role, read job records, see instances' tags.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jobplane.clouds import aws_secrets
from jobplane.clouds.base import Scope
from jobplane.decide import vend
from jobplane.model import keys

Statement = dict[str, Any]
Document = dict[str, Any]
VERSION = "2012-10-17"
# AWS refuses a session policy whose plain text is longer (AssumeRole's Policy parameter).
SESSION_POLICY_LIMIT = 2048
# The longest of each name a session policy holds, to size the worst case: a job id or an owner (63 characters,
# keys.JOB_ID_PATTERN and the spec's owner pattern), an S3 bucket, the partition (aws-us-gov).
LONGEST_ID = "o" * 63
MAX_BUCKET_NAME = 63
LONGEST_PARTITION = "aws-us-gov"
LONGEST_ATTEMPT = 10 ** 6 - 1  # JobFacts' bound on an attempt

# Registry areas an agent reads and writes (relative to the registry root): the job role's grants. Never a job's
# record, events or any key the functions trust for identity, scope or money; every session narrows these to one job
# (decide.vend.scope). A job recorded before its data moved under teams/ keeps it in jobs/<id>/ (keys.JobData).
_LEGACY_DATA = tuple(f"jobs/*/{area}*" for area in keys.DATA_AREAS)
AGENT_READ = ("jobs/*/job.json", "jobs/*/code/*", "code/*", "teams/*", "jobs/*/checkpoints/*",
              "jobs/*/attempts/*/cluster.json", "jobs/*/control/stop", "system/agent/*")
AGENT_WRITE = ("heartbeats/*", "teams/*", *_LEGACY_DATA, "jobs/*/attempts/*/nodes/*/exit.json", "preempted-jobs/*")
# Synced directories: after each manifest the agent deletes the objects it no longer names (an old
# checkpoint the training code removed) and aborts a multipart upload it gave up on.
AGENT_PRUNE = ("teams/*/checkpoints/*", "teams/*/artifacts/*", "jobs/*/checkpoints/*", "jobs/*/artifacts/*")
# the chunks the log lifecycle rule expires, by their tag
TAGGED = ("teams/*/logs/*", "teams/*/metrics/*", "teams/*/system/*", "jobs/*/logs/*", "jobs/*/metrics/*",
          "jobs/*/system/*")
# What a session may do on its job's own keys (the job role's grants still apply on top: the intersection).
SECRET_PARAMETERS = "arn:*:ssm:*:*:parameter/jobplane/*"
SESSION_OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                          "s3:PutObjectTagging")


def document(statements: Sequence[Statement]) -> Document:
    return {"Version": VERSION, "Statement": list(statements)}


def bucket_arn(partition: str, bucket: str) -> str:
    return f"arn:{partition}:s3:::{bucket}"


def data_bucket_statement(partition: str, data_buckets: Sequence[str]) -> Statement | None:
    """Read (and list) the platform's input-data buckets; None without any."""
    if not data_buckets:
        return None
    arns = [bucket_arn(partition, name) for name in data_buckets]
    return {"Sid": "ReadInputDataBuckets", "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
            "Resource": [*arns, *(f"{a}/*" for a in arns)]}


def job_role_statements(registry_arn: str, prefix: str) -> list[Statement]:
    """The job role: what an agent may do in the registry, for any job (every session narrows it to one). Nothing
    else: the platform's data buckets are read with the VM's own identity (vm_role_statements), as is a `code:`
    there (jobplane.agent.cli.cloud_adapters).

    ListBucket is on the whole registry bucket here; the session policy conditions it on the job's prefixes.
    registry_arn may be a CDK token; prefix is the registry root as a key prefix ("" or "team-a/")."""
    def objects(*patterns: str) -> list[str]:
        return [f"{registry_arn}/{prefix}{p}" for p in patterns]

    statements: list[Statement] = [
        {"Sid": "ReadJobRecordCodeCheckpointsClusterStopAndAgent", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": objects(*AGENT_READ)},
        {"Sid": "WriteHeartbeatsLogsMetricsEventFilesCheckpointsArtifactsExitReportsPreemptedMarker", "Effect": "Allow",
         "Action": "s3:PutObject", "Resource": objects(*AGENT_WRITE)},
        {"Sid": "PruneSyncedCheckpointsAndArtifacts", "Effect": "Allow",
         "Action": ["s3:DeleteObject", "s3:AbortMultipartUpload"], "Resource": objects(*AGENT_PRUNE)},
        # a PutObject carrying tags needs this too; only log and metrics chunks (system metrics too) are tagged
        {"Sid": "TagLogChunksForTheirLifecycleRule", "Effect": "Allow", "Action": "s3:PutObjectTagging",
         "Resource": objects(*TAGGED)},
        {"Sid": "ListRegistryKeys", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": registry_arn},
        # every session's policy names exactly its job's secrets (session_policy); the deployment's tag is a hash of
        # the bucket's name, which a synth may not know yet
        {"Sid": "ReadSecretsTheSessionNames", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": SECRET_PARAMETERS},
    ]
    return statements


def vm_role_statements(vend_function_arn: str, partition: str, data_buckets: Sequence[str],
                       container_repositories: Sequence[str] = (), ssh: bool = False) -> list[Statement]:
    """The VM's own identity: ask the vending function (through its IAM-authenticated URL only), read input
    data, pull job containers from the ECR repositories named (ARNs) and, with ssh, be reached through SSM
    Session Manager (its agent dials out: no inbound port). Nothing in the registry: the bootstrap fetches the
    agent through URLs the launcher presigned."""
    statements: list[Statement] = [
        {"Sid": "AskTheVendingFunctionForTheJobsCredentials", "Effect": "Allow",
         "Action": "lambda:InvokeFunctionUrl", "Resource": vend_function_arn,
         "Condition": {"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}}},
    ]
    data = data_bucket_statement(partition, data_buckets)
    if container_repositories:
        # GetAuthorizationToken has no resource-level permissions: "*" is the only possible resource
        statements += [{"Sid": "LogInToEcr", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
                       {"Sid": "PullJobContainers", "Effect": "Allow",
                        "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                   "ecr:BatchCheckLayerAvailability"],
                        "Resource": list(container_repositories)}]
    if ssh:  # what the SSM agent needs for Session Manager, nothing of Run Command or Parameter Store
        statements.append({"Sid": "SessionManager", "Effect": "Allow", "Resource": "*",
                           "Action": ["ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel",
                                      "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel",
                                      "ssmmessages:OpenDataChannel"]})
    return statements + ([data] if data else [])


def vend_role_statements(job_role_arn: str, registry_arn: str, prefix: str) -> list[Statement]:
    """The vending function: assume the job role (with a session policy), read job records, see tags."""
    return [
        {"Sid": "AssumeTheJobRole", "Effect": "Allow", "Action": "sts:AssumeRole", "Resource": job_role_arn},
        {"Sid": "ReadJobRecords", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": f"{registry_arn}/{prefix}jobs/*/job.json"},
        # EC2 Describe* calls support no resource-level permissions: "*" is the only possible resource.
        {"Sid": "ReadInstanceTags", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
    ]


# A team member: a principal tagged jobplane-owner=<team> (the IAM user's or role's tag, or a session tag from SSO,
# SAML or OIDC), whose tag IAM substitutes into the resources, so it writes only its own team's folders: its drops,
# its code bundles and its cancel requests (which the functions carry out: jobplane.control.cancels). It reads every
# job's record (id, owner, state, spec: `jobplane ls` and `queue` show every team's), and only its own team's jobs'
# data (teams/<owner>/) and code bundles. A principal without the tag matches nothing of its own.
OWNER_TAG = "jobplane-owner"
OWNER = f"${{aws:PrincipalTag/{OWNER_TAG}}}"
SUBMITTER_WRITE = (f"queue/{OWNER}/*", f"code/{OWNER}/*", f"cancels/{OWNER}/*")
SUBMITTER_READ = ("jobs/*", "queue/*", "rejected/*", "sweeps/*", "admission/*", "active/*", "active-sweeps/*",
                  "heartbeats/*", "preempted-jobs/*", keys.POLICY, f"teams/{OWNER}/*", f"code/{OWNER}/*")
# the data of a job recorded before its data moved under teams/, in its record's folder: no team's to read
SUBMITTER_DENIED = (*_LEGACY_DATA, "jobs/*/code/*")


# a team's secrets (every piece, to write or delete) and their heads (to read): the deployment's tag is a hash of the
# bucket's name, which a synth may not know yet
SECRET_MEMBER_PATTERNS = (f"arn:*:ssm:*:*:parameter/jobplane/*/{OWNER}/*",
                          f"arn:*:ssm:*:*:parameter/jobplane/*/{OWNER}/*/head")


def submitter_statements(registry_arn: str, prefix: str) -> list[Statement]:
    """The stack's submitter policy (output SubmitterPolicyArn): what `jobplane submit`, `ls`, `queue`, `describe`,
    `logs`, `metrics`, `cost` and `cancel` need of a team member, and nothing of another team's data."""
    def objects(*patterns: str) -> list[str]:
        return [f"{registry_arn}/{prefix}{p}" for p in patterns]

    return [
        {"Sid": "WriteOnlyTheTeamsDropsCodeAndCancelRequests", "Effect": "Allow",
         "Action": ["s3:PutObject", "s3:AbortMultipartUpload"], "Resource": objects(*SUBMITTER_WRITE)},
        {"Sid": "ReadRecordsAndTheTeamsOwnData", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": objects(*SUBMITTER_READ)},
        {"Sid": "NeverTheDataOfJobsRecordedBeforeTeams", "Effect": "Deny", "Action": "s3:GetObject",
         "Resource": objects(*SUBMITTER_DENIED)},
        {"Sid": "ListRegistryKeys", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": registry_arn},
        # EC2 Describe* calls support no resource-level permissions: "*" is the only possible resource.
        {"Sid": "DescribeJobInstances", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
        *secret_member_statements(),
    ]


def secret_member_statements() -> list[Statement]:
    """`jobplane secret set|ls|rm` for a team member: write and delete its own team's secrets, read their heads
    (which pieces are current: never a value), list every secret's name (DescribeParameters has no resource-level
    permissions). Never a piece: a value is read only by its jobs' sessions."""
    own, heads = SECRET_MEMBER_PATTERNS
    return [{"Sid": "WriteTheTeamsSecrets", "Effect": "Allow", "Action": ["ssm:PutParameter", "ssm:DeleteParameter"],
             "Resource": own},
            {"Sid": "ReadTheTeamsSecretHeads", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": heads},
            {"Sid": "ListSecretNames", "Effect": "Allow", "Action": "ssm:DescribeParameters", "Resource": "*"}]


def trust(principal: dict[str, Any]) -> Document:
    """An assume-role (trust) policy for one principal ({"Service": ...} or {"AWS": <role ARN>})."""
    return document([{"Effect": "Allow", "Principal": principal, "Action": "sts:AssumeRole"}])


def session_policy(scope: Scope, partition: str, deployment: str = "") -> Document:
    """The session policy of one job's credentials (`policy_document`). Raises ValueError if a key holds an IAM
    wildcard (it would widen the grant) or the policy is over AWS's size limit."""
    policy = policy_document(scope, partition, deployment)
    if len(packed(policy)) > SESSION_POLICY_LIMIT:
        raise ValueError(f"its session policy would be {len(packed(policy))} characters, over AWS's "
                         f"{SESSION_POLICY_LIMIT} (the job's id, owner, code name and secrets, the deployment's "
                         f"bucket, root)")
    return policy


def policy_document(scope: Scope, partition: str, deployment: str = "") -> Document:
    """A job's keys read-write, the read-only ones (an object exactly that object) and listings only under its own
    prefixes, whatever its size. ValueError for an IAM wildcard in a key."""
    entries = (*scope.read_write, *scope.read_write_objects, *scope.read_only, *scope.read_only_objects)
    if any(c in entry for entry in entries for c in "*?$"):
        raise ValueError(f"a scope key holds an IAM wildcard or variable: {entries}")
    registry = bucket_arn(partition, scope.bucket)
    folder = scope.record_folder

    def folded(entries: Sequence[str]) -> list[str]:
        """The entries, those under the record's folder named by the folder itself: the job role lets a session
        write only an agent's kinds of key there (AGENT_WRITE), and naming each would pass the size limit."""
        return list(dict.fromkeys(folder if folder and k.startswith(folder) else k for k in entries))

    def resource(key: str) -> str:  # a prefix ends in "/": everything under it; otherwise the one object
        return f"{registry}/{key}*" if key.endswith("/") else f"{registry}/{key}"

    own = folded((*scope.read_write, *scope.read_write_objects))

    def covered(key: str) -> bool:  # already granted by an entry of `own`
        return any(key.startswith(k) if k.endswith("/") else key == k for k in own)

    read_only = [k for k in folded((*scope.read_only, *scope.read_only_objects)) if not covered(k)]
    listable = [key + "*" for key in (*own, *read_only) if key.endswith("/")]  # objects are read, never listed
    # no Sids: every character counts against the size limit (the job's own keys; read-only keys; listings)
    statements: list[Statement] = [
        {"Effect": "Allow", "Action": list(SESSION_OBJECT_ACTIONS), "Resource": [resource(k) for k in own]},
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": [resource(k) for k in read_only]},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": registry,
         "Condition": {"StringLike": {"s3:prefix": listable}}},
    ]
    if scope.secrets:  # exactly the owner's secrets the spec names, read only (the job role allows jobplane/*)
        statements.append({"Effect": "Allow", "Action": "ssm:GetParameter", "Resource": [
            aws_secrets.resource_arn(partition, deployment, scope.secret_owner, name) for name in scope.secrets]})
    return document(statements)


def worst_case_policy_size(bucket: str | None, root: str) -> int:
    """The size of the longest session policy a job this deployment accepts can need: the longest job id, owner
    and code bundle name (keys.JOB_ID_PATTERN, the spec's owner, decide.vend.MAX_CODE_NAME) in the longest
    partition, with this bucket (S3's longest name when CloudFormation names it) and root."""
    name = "c" * (vend.MAX_CODE_NAME - len(".tar.gz")) + ".tar.gz"
    code = keys.root_prefix(root) + keys.code_folder(LONGEST_ID) + name
    longest = vend.scope(bucket or "b" * MAX_BUCKET_NAME, root, keys.JobData(LONGEST_ID, LONGEST_ID),
                         LONGEST_ATTEMPT, code)
    return len(packed(policy_document(longest, LONGEST_PARTITION)))


def check_fits(bucket: str | None, root: str) -> None:
    """ValueError naming the root when some job's credentials could not be vended on this deployment."""
    size = worst_case_policy_size(bucket, root)
    if size > SESSION_POLICY_LIMIT:
        raise ValueError(f"the registry root {root!r} makes a job's session policy up to {size} characters, over "
                         f"AWS's {SESSION_POLICY_LIMIT}: give a shorter root")


def packed(policy: Document) -> str:
    """The policy as sent to AssumeRole: JSON without spaces."""
    return json.dumps(policy, separators=(",", ":"))
