"""JobplaneControlPlane: the whole AWS control plane as one reusable construct.

registry bucket (+ access-log bucket) · four Lambdas (launcher, sweeper, rerun, uptime-cap) · EventBridge
rules and one schedule per cron · VM role + instance profile · cluster placement group · security group ·
agent bundles and config/policy.yaml uploaded at deploy time · DLQ · dashboard + alarms to SNS · unless
you bring a VPC, one whose egress jobplane:network chooses (public subnets by default: no NAT, no idle cost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3deploy
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.aws import bundle, permissions
from infra.aws.config import ControlPlaneConfig
from infra.aws.nag import acknowledge
from infra.aws.notifications import JobNotifications
from infra.aws.observability import Observability
from jobplane.clouds.base import LOG_OBJECT_TAG
from jobplane.model import keys
from jobplane.model.policy import policy_from
from jobplane.vending import aws_iam

LOG_CHUNK_TAG = LOG_OBJECT_TAG  # the agent tags every log chunk with it
# Events only say "look at this job now" and every cron run reconciles everything, so a stale event is
# worth little: retry briefly, then park it in the DLQ (the depth alarm shows something is wrong).
EVENT_RETRIES = 2
EVENT_MAX_AGE = cdk.Duration.hours(1)


class FunctionLogging(TypedDict):
    """The lambda_.Function arguments every function shares (typed, so mypy checks each against Function's)."""

    tracing: lambda_.Tracing
    logging_format: lambda_.LoggingFormat
    application_log_level_v2: lambda_.ApplicationLogLevel
    system_log_level_v2: lambda_.SystemLogLevel


# Every function: traced, JSON logs at INFO (its own) and WARN (the platform's)
LOGGING = FunctionLogging(tracing=lambda_.Tracing.ACTIVE, logging_format=lambda_.LoggingFormat.JSON,
                          application_log_level_v2=lambda_.ApplicationLogLevel.INFO,
                          system_log_level_v2=lambda_.SystemLogLevel.WARN)
UPLOADER_MEMORY_MB = 512  # one BucketDeployment singleton Lambda serves both uploads
# The vend function's reserved concurrency, as on GCP (max_instance_count): a refresh per VM per hour and a burst
# when a big job boots (the agent retries a 429), and no flood of VM requests takes the account's concurrency.
VEND_RESERVED = 20


@dataclass(frozen=True)
class FunctionSpec:
    name: str  # module in functions/aws
    timeout_s: int
    launches: bool  # RunInstances + PassRole
    terminates: bool
    # Reserved concurrency, the most runs at once (and kept for it): 1 where overlapping runs would only repeat the
    # same reconcile (claims are CAS-safe anyway); the launcher's drops run in parallel, 10 at most, as on GCP (its
    # max_instance_count), so a flood of drops waits in Lambda's async retries instead of taking the account's
    # concurrency from everything else.
    reserved: int


# Every reconciler launches: a run that ends an attempt admits the jobs waiting for its nodes and releases those
# waiting for its job (control.reconcile.apply: admit_in_order, release_dependents), and the check retries. The local
# cloud, running each function under its synthesized role, refused the sweeper's launches when it could not.
FUNCTIONS = (
    FunctionSpec("launcher", 120, launches=True, terminates=False, reserved=10),
    FunctionSpec("sweeper", 300, launches=True, terminates=True, reserved=1),
    FunctionSpec("rerun", 300, launches=True, terminates=True, reserved=1),
    FunctionSpec("uptime_cap", 120, launches=True, terminates=True, reserved=1),
)


def _title(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


class JobplaneControlPlane(Construct):
    def __init__(self, scope: Construct, construct_id: str, config: ControlPlaneConfig) -> None:
        super().__init__(scope, construct_id)
        # Access-log delivery through a bucket policy rather than the deprecated LogDeliveryWrite ACL.
        self.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
        self.config = config
        prefix = config.key_prefix
        try:  # every job's credentials must be vendable: AWS caps the session policy that narrows them
            aws_iam.check_fits(config.bucket_name, prefix)
        except ValueError as exc:
            raise ValueError(f"jobplane:root: {exc}") from None
        self.access_logs = self._access_log_bucket()
        self.bucket = self._registry_bucket()
        # what the functions tag every VM with and IAM requires for a launch or a terminate (Settings.deployment)
        root = config.key_prefix.rstrip("/")
        self.deployment = self.bucket.bucket_name + (f"/{root}" if root else "")
        network = self._network()
        self.vm_role, self.instance_profile = self._vm_identity()
        self.dead_letters = self._dead_letter_queue()

        asset = lambda_.Code.from_asset(str(bundle.lambda_asset()))
        self.functions = {spec.name: self._function(spec, asset, network) for spec in FUNCTIONS}
        self.job_role, self.vend, self.vend_url = self._vending(asset)
        self._vm_policy()
        self._rules()
        self._uploads(network)
        self.observability = Observability(self, "Observability", self.functions, self.dead_letters,
                                           config.alarm_email, config.dashboard)
        self.notifications = JobNotifications(self, "Notifications", config.notify_email)
        self.notifications.publishers(self.functions)
        self.submitters = self._submitter_policy()
        submit_env = f"JOBPLANE_ROOT={prefix.rstrip('/')} " if prefix else ""
        cdk.CfnOutput(self, "BucketName", value=self.bucket.bucket_name, description="the jobplane registry")
        cdk.CfnOutput(self, "SubmitCommand", description="submit a job",
                      value=f"{submit_env}jobplane submit job.yaml --code ./src --bucket {self.bucket.bucket_name}")
        cdk.CfnOutput(self, "NotificationTopicArn", value=self.notifications.topic.topic_arn,
                      description="job notifications (ended, idle GPUs): subscribe e-mail, chat or a queue")
        cdk.CfnOutput(self, "SubmitterPolicyArn", value=self.submitters.managed_policy_arn,
                      description=f"attach to teams' users or roles tagged {permissions.OWNER_TAG}=<owner>: they "
                                  f"submit only as that owner")

    # ---- storage ------------------------------------------------------------------------------------
    def _access_log_bucket(self) -> s3.Bucket:
        # Versioned, so a log deleted or overwritten before its year is up (by mistake, or to hide a trail) can
        # still be read for 30 days; logs are never rewritten, so that costs nothing otherwise.
        logs_bucket = s3.Bucket(
            self, "AccessLogs",
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            encryption=s3.BucketEncryption.S3_MANAGED,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(id="ExpireAccessLogs", expiration=cdk.Duration.days(365),
                                              noncurrent_version_expiration=cdk.Duration.days(30)),
                             s3.LifecycleRule(id="DropExpiredDeleteMarkers", expired_object_delete_marker=True)],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        acknowledge(logs_bucket, "AwsSolutions-S1",
                    "This bucket is the access-log target of the registry bucket and the VPC flow logs; "
                    "logging it into itself would loop.")
        return logs_bucket

    def _registry_bucket(self) -> s3.Bucket:
        prefix = self.config.key_prefix
        return s3.Bucket(
            self, "Registry",
            bucket_name=self.config.bucket_name,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            encryption=s3.BucketEncryption.S3_MANAGED,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="registry/",
            event_bridge_enabled=True,
            removal_policy=cdk.RemovalPolicy.RETAIN,
            lifecycle_rules=[
                # Log chunks live under jobs/<id>/logs/ (no common prefix), so they are found by tag.
                s3.LifecycleRule(id="ExpireOldLogChunks", tag_filters=dict([LOG_CHUNK_TAG]),
                                 expiration=cdk.Duration.days(self.config.log_chunk_days),
                                 noncurrent_version_expiration=cdk.Duration.days(1)),
                # Heartbeats are rewritten every 30 s: keep no history of them.
                s3.LifecycleRule(id="DropHeartbeatHistory", prefix=f"{prefix}heartbeats/",
                                 noncurrent_version_expiration=cdk.Duration.days(1)),
                s3.LifecycleRule(id="DropOldVersions", noncurrent_version_expiration=cdk.Duration.days(30),
                                 abort_incomplete_multipart_upload_after=cdk.Duration.days(7)),
                s3.LifecycleRule(id="DropExpiredDeleteMarkers", expired_object_delete_marker=True),
            ],
        )

    # ---- network ------------------------------------------------------------------------------------
    def _network(self) -> Network:
        cfg = self.config
        if cfg.vpc_id:
            if not cfg.subnet_ids:
                raise ValueError("jobplane:subnetIds: required when jobplane:vpcId is set (the VMs' subnets)")
            vpc: ec2.IVpc = ec2.Vpc.from_vpc_attributes(self, "Vpc", vpc_id=cfg.vpc_id,
                                                        availability_zones=cdk.Fn.get_azs())
            subnets = list(cfg.subnet_ids)
            public_ip = None  # your subnets and routes decide (or aws.public_ip in jobplane:policy)
        else:
            if cfg.subnet_ids:
                raise ValueError("jobplane:vpcId: required when jobplane:subnetIds is set")
            if cfg.network not in NETWORKS:
                raise ValueError(f"jobplane:network: {cfg.network!r} is not one of {', '.join(NETWORKS)}")
            egress = NETWORKS[cfg.network]
            vpc = self._new_vpc(egress)
            subnets = vpc.select_subnets(subnet_group_name=JOB_SUBNETS).subnet_ids
            public_ip = egress.public_ip
        group = ec2.SecurityGroup(self, "JobSecurityGroup", vpc=vpc, allow_all_outbound=True,
                                  description="jobplane VMs: inbound only from VMs in this group")
        group.add_ingress_rule(group, ec2.Port.all_traffic(), "between the VMs of jobplane jobs (NCCL, torchrun)")
        placement = ec2.PlacementGroup(self, "ClusterPlacement", strategy=ec2.PlacementGroupStrategy.CLUSTER)
        return Network(subnets, group, placement, public_ip)

    def _new_vpc(self, egress: Egress) -> ec2.Vpc:
        """Two zones of job subnets, egress as jobplane:network chose, and an S3 gateway endpoint (free) in
        every case, so registry and data traffic never crosses the internet or a NAT gateway."""
        public = egress.subnet_type == ec2.SubnetType.PUBLIC
        # Public subnets assign no address themselves: VMs get one because the launcher asks (aws.public_ip).
        layout = [ec2.SubnetConfiguration(name=JOB_SUBNETS, subnet_type=egress.subnet_type, cidr_mask=20,
                                          map_public_ip_on_launch=False if public else None)]
        if egress.nat_gateways:  # the NAT gateway lives in a small public subnet of its own
            layout.append(ec2.SubnetConfiguration(name="nat", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=26,
                                                  map_public_ip_on_launch=False))
        vpc = ec2.Vpc(
            self, "Vpc",
            max_azs=2,
            nat_gateways=egress.nat_gateways,
            subnet_configuration=layout,
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
        )
        vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_s3(self.access_logs, "vpc-flow-logs/"))
        return vpc

    # ---- identities ---------------------------------------------------------------------------------
    def _vm_identity(self) -> tuple[iam.Role, iam.InstanceProfile]:
        role = iam.Role(self, "VmRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                        description="jobplane VM: ask the vending function for its job's credentials, read inputs")
        profile = iam.InstanceProfile(self, "VmInstanceProfile", role=role)
        return role, profile

    def _vm_policy(self) -> None:
        policy = iam.Policy(self, "VmPolicy", roles=[self.vm_role],
                            statements=permissions.vm_statements(self.vend, self.config.data_buckets,
                                                                 self.config.container_repositories,
                                                                 self.config.ssh))
        self._acknowledge_data_buckets(policy)
        if self.config.container_repositories or self.config.ssh:
            acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                        "ecr:GetAuthorizationToken and the SSM agent's Session Manager actions support no "
                        "resource-level permissions; pulls are limited to jobplane:containerRepositories.")

    def _acknowledge_data_buckets(self, policy: iam.Policy) -> None:
        for name in self.config.data_buckets:
            acknowledge(policy, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{name}/*]",
                        f"{name} is an input-data bucket named in jobplane:dataBuckets; VMs only read it.")

    def _vending(self, code: lambda_.Code) -> tuple[iam.Role, lambda_.Function, lambda_.FunctionUrl]:
        """The credential vending function behind an IAM-authenticated URL, and the job role it assumes with a
        session policy naming one job's keys (jobplane.vending.aws); the job role trusts that function only."""
        prefix = self.config.key_prefix
        vend_role = iam.Role(self, "VendRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                             description="jobplane vend function: mint a job's credentials for its own VMs")
        job_role = iam.Role(self, "JobRole", assumed_by=iam.ArnPrincipal(vend_role.role_arn),
                            max_session_duration=cdk.Duration.hours(1),
                            description="jobplane agent: a job's keys, narrowed per job by the vending function")
        job_policy = iam.Policy(self, "JobPolicy", roles=[job_role], statements=permissions.job_statements(
            self.bucket, prefix))
        for pattern in permissions.AGENT_AREAS:
            acknowledge(job_policy, f"AwsSolutions-IAM5[Resource::<{self.bucket_id()}.Arn>/{prefix}{pattern}]",
                        f"Job ids and file names are chosen at run time; {pattern} confines the agent to that one "
                        "area of the registry, and each session policy to its own job's keys.")
        acknowledge(job_policy, f"AwsSolutions-IAM5[Resource::{permissions.SECRET_PARAMETERS}]",
                    "Secrets are named at run time; each session policy names exactly its job's secrets' parameters "
                    "(jobplane/<deployment>/<owner>/<name>/*), and the role is assumed only with one.")
        vend_policy = iam.Policy(self, "VendPolicy", roles=[vend_role],
                                 statements=permissions.vend_statements(job_role, self.bucket, prefix))
        acknowledge(vend_policy, "AwsSolutions-IAM5[Resource::*]",
                    "ec2:DescribeInstances supports no resource-level permissions (the caller instance's tags).")
        acknowledge(vend_policy, f"AwsSolutions-IAM5[Resource::<{self.bucket_id()}.Arn>/{prefix}jobs/*/job.json]",
                    "Any job may ask for its credentials; the function reads only job records (jobs/*/job.json).")
        log_group = logs.LogGroup(self, "VendLogs", retention=_retention(self.config.log_retention_days),
                                  removal_policy=cdk.RemovalPolicy.DESTROY)
        fn = lambda_.Function(
            self, "Vend",
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.ARM_64,
            code=code,
            handler="functions.aws.vend.handler",
            memory_size=256,
            timeout=cdk.Duration.seconds(30),
            role=vend_role,
            environment={**self._environment(),
                         "JOBPLANE_VM_ROLE_ARN": self.vm_role.role_arn,
                         "JOBPLANE_JOB_ROLE_ARN": job_role.role_arn},
            log_group=log_group,
            reserved_concurrent_executions=VEND_RESERVED if self.config.reserved_concurrency else None,
            description="jobplane vend: a job's storage credentials for its own VMs",
            **LOGGING,
        )
        log_group.grant_write(vend_role)
        acknowledge(vend_role.node.find_child("DefaultPolicy"), "AwsSolutions-IAM5[Resource::*]",
                    "X-Ray PutTraceSegments/PutTelemetryRecords support no resource-level permissions.")
        url = fn.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)
        for spec in FUNCTIONS:
            if spec.launches:  # the launcher hands the URL to the VMs it starts (Settings.vend_url)
                self.functions[spec.name].add_environment("JOBPLANE_VEND_URL", url.url)
        cdk.CfnOutput(self, "VendUrl", value=url.url, description="the credential vending function's URL (IAM auth)")
        return job_role, fn, url

    def _submitter_policy(self) -> iam.ManagedPolicy:
        """For the people and CI roles that submit jobs: attach it to principals tagged jobplane-owner=<team>."""
        prefix = self.config.key_prefix
        policy = iam.ManagedPolicy(self, "SubmitterPolicy", statements=permissions.submitter_statements(
            self.bucket, prefix), description=f"jobplane: submit and cancel as the principal's own owner (tag "
                                              f"{permissions.OWNER_TAG}); read every job's record, the team's data")
        for pattern in permissions.SUBMITTER_PATTERNS:
            shown = pattern.replace("${", "<").replace("}", ">")  # how cdk-nag prints a policy variable
            acknowledge(policy, f"AwsSolutions-IAM5[Resource::<{self.bucket_id()}.Arn>/{prefix}{shown}]",
                        f"{pattern}: job ids and file names are chosen at submit time; the owner part is the "
                        "principal's own tag, so a team writes only its own folders.")
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "ec2:DescribeInstances and ssm:DescribeParameters support no resource-level permissions (describe "
                    "shows a job's VMs; `secret ls` lists secrets' names, never a value).")
        for arn in permissions.SECRET_MEMBER_PATTERNS:
            acknowledge(policy, f"AwsSolutions-IAM5[Resource::{arn.replace('${', '<').replace('}', '>')}]",
                        "A team's secrets are named at set time; the owner part is the principal's own tag, so a team "
                        "writes only its own secrets and reads only their heads (which pieces are current), no value.")
        return policy

    def _dead_letter_queue(self) -> sqs.Queue:
        queue = sqs.Queue(self, "DeadLetters", encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                          retention_period=cdk.Duration.days(14))
        acknowledge(queue, "AwsSolutions-SQS3",
                    "This queue is the dead-letter queue of the functions and rule targets; it has none itself.")
        return queue

    def _function(self, spec: FunctionSpec, code: lambda_.Code, network: Network) -> lambda_.Function:
        title = _title(spec.name)
        log_group = logs.LogGroup(self, f"{title}Logs", retention=_retention(self.config.log_retention_days),
                                  removal_policy=cdk.RemovalPolicy.DESTROY)
        role = iam.Role(self, f"{title}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description=f"jobplane {spec.name} function")
        statements = [permissions.describe_statement()]
        if spec.launches:
            statements += permissions.launch_statements(self.vm_role, network.subnets, network.group.security_group_id,
                                                        network.placement.placement_group_name, self.deployment)
            statements += [permissions.image_parameters_statement(), permissions.spot_price_statement()]
        if spec.terminates:
            statements += permissions.terminate_statements(self.deployment)
        policy = iam.Policy(self, f"{title}Ec2Policy", roles=[role], statements=statements)
        fn = lambda_.Function(
            self, title,
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.ARM_64,
            code=code,
            handler=f"functions.aws.{spec.name}.handler",
            memory_size=512,
            timeout=cdk.Duration.seconds(spec.timeout_s),
            role=role,
            environment=self._environment(),
            log_group=log_group,
            **LOGGING,
            reserved_concurrent_executions=spec.reserved if self.config.reserved_concurrency else None,
            dead_letter_queue=self.dead_letters,
            retry_attempts=EVENT_RETRIES,
            max_event_age=EVENT_MAX_AGE,
            description=f"jobplane {spec.name.replace('_', '-')}",
        )
        self.bucket.grant_read_write(role)
        self.bucket.grant_delete(role)
        log_group.grant_write(role)
        self._acknowledge_function_findings(role, policy, spec)
        return fn

    def _environment(self) -> dict[str, str]:
        """What every function reads: the registry (Settings), Powertools' names, and pydantic's plugins off (it
        would scan every bundled distribution's entry points at the first model of each cold start; none is used)."""
        return {"JOBPLANE_BUCKET": self.bucket.bucket_name, "JOBPLANE_ROOT": self.config.key_prefix.rstrip("/"),
                "POWERTOOLS_SERVICE_NAME": "jobplane", "POWERTOOLS_METRICS_NAMESPACE": "jobplane",
                "PYDANTIC_DISABLE_PLUGINS": "__all__"}

    def bucket_id(self) -> str:
        """The registry's logical id as cdk-nag prints it in findings (<Id.Arn>)."""
        stack = cdk.Stack.of(self)
        bucket = self.bucket.node.default_child  # the s3.CfnBucket an s3.Bucket always has
        if not isinstance(bucket, cdk.CfnElement):
            raise TypeError(f"the registry bucket's default child is a {type(bucket).__name__}, not a CfnElement")
        return str(stack.resolve(stack.get_logical_id(bucket)))

    def _acknowledge_function_findings(self, role: iam.Role, policy: iam.Policy, spec: FunctionSpec) -> None:
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "ec2:DescribeInstances/DescribeImages/DescribeSubnets support no resource-level permissions.")
        if spec.launches:
            for arn, reason in permissions.IMAGE_PARAMETERS.items():
                acknowledge(policy, f"AwsSolutions-IAM5[Resource::{arn}]", reason)
        used = {"instance/*"} | ({"volume/*", "network-interface/*", "spot-instances-request/*", "key-pair/*",
                                   "image/*"} if spec.launches else set())
        for resource, reason in permissions.EC2_WILDCARDS.items():
            if resource in used:
                account = "" if resource == "image/*" else "<AWS::AccountId>"
                arn = f"arn:<AWS::Partition>:ec2:<AWS::Region>:{account}:{resource}"
                acknowledge(policy, f"AwsSolutions-IAM5[Resource::{arn}]", reason)
        default = role.node.find_child("DefaultPolicy")
        acknowledge(default, "AwsSolutions-IAM5[Resource::*]",
                    "X-Ray PutTraceSegments/PutTelemetryRecords support no resource-level permissions.")
        single_writer = ("The control plane is the registry's single writer: it reads, writes, lists and deletes "
                         "any registry key (grant_read_write/grant_delete on this one bucket only).")
        acknowledge(default, f"AwsSolutions-IAM5[Resource::<{self.bucket_id()}.Arn>/*]", single_writer)
        for action in ("s3:GetBucket*", "s3:GetObject*", "s3:List*", "s3:Abort*", "s3:DeleteObject*"):
            acknowledge(default, f"AwsSolutions-IAM5[Action::{action}]", single_writer)

    # ---- triggers -----------------------------------------------------------------------------------
    def _target(self, name: str) -> targets.LambdaFunction:
        return targets.LambdaFunction(self.functions[name], dead_letter_queue=self.dead_letters,
                                      retry_attempts=EVENT_RETRIES, max_event_age=EVENT_MAX_AGE)

    def _object_created(self, rule_id: str, key: list[str], target: str, description: str) -> events.Rule:
        return events.Rule(
            self, rule_id, description=description,
            event_pattern=events.EventPattern(
                source=["aws.s3"], detail_type=["Object Created"],
                detail={"bucket": {"name": [self.bucket.bucket_name]}, "object": {"key": key}},
            ),
            targets=[self._target(target)],
        )

    def _rules(self) -> None:
        prefix = self.config.key_prefix
        self._object_created("QueueDropRule", events.Match.prefix(f"{prefix}queue/"), "launcher",
                             "a spec dropped in queue/ -> launcher")
        self._object_created("CancelRequestRule", events.Match.prefix(f"{prefix}cancels/"), "launcher",
                             "a team member's cancel request in cancels/ -> launcher")
        self._object_created("ExitReportRule",
                             [*events.Match.wildcard(f"{prefix}jobs/*/attempts/*/nodes/*/exit.json"),
                              *events.Match.wildcard(f"{prefix}jobs/*/attempts/*/boot-failure.json")], "sweeper",
                             "an agent's exit report or a VM's failed boot -> sweeper")
        self._object_created("PreemptedMarkerRule", events.Match.prefix(f"{prefix}preempted-jobs/"), "rerun",
                             "a preempted-jobs/ marker -> rerun")
        events.Rule(self, "SpotInterruptionRule", description="EC2 Spot interruption warning -> rerun",
                    event_pattern=events.EventPattern(source=["aws.ec2"],
                                                      detail_type=["EC2 Spot Instance Interruption Warning"]),
                    targets=[self._target("rerun")])
        events.Rule(self, "InstanceStateRule", description="an instance stopping or gone -> sweeper",
                    event_pattern=events.EventPattern(
                        source=["aws.ec2"], detail_type=["EC2 Instance State-change Notification"],
                        detail={"state": ["shutting-down", "terminated", "stopping", "stopped"]}),
                    targets=[self._target("sweeper")])
        for name, expression in self.config.schedules.items():
            events.Rule(self, f"{_title(name)}Schedule", description=f"cron -> {name}",
                        schedule=events.Schedule.expression(expression), targets=[self._target(name)])

    # ---- deploy-time uploads ------------------------------------------------------------------------
    def policy_document(self, network: Network) -> dict[str, Any]:
        """config/policy.yaml: the default caps from the context plus where this stack's VMs go."""
        caps = dict(self.config.policy)
        placement = {
            **caps.get("aws", {}),
            "instance_profile": self.instance_profile.instance_profile_name,
            "subnets": list(network.subnets),
            "security_groups": [network.group.security_group_id],
            **({} if network.public_ip is None else {"public_ip": network.public_ip}),
            "placement_group": network.placement.placement_group_name,
        }
        document = {**caps, "aws": placement}
        policy_from(document)  # a bad cap in cdk.json fails the synth, naming the field
        return document

    def _uploads(self, network: Network) -> None:
        prefix = self.config.key_prefix
        agent = bundle.agent_bundles(self.config.vm_pythons)
        s3deploy.BucketDeployment(self, "AgentBundles", sources=[s3deploy.Source.asset(str(agent))],
                                  destination_bucket=self.bucket, destination_key_prefix=f"{prefix}{keys.AGENT}",
                                  prune=True, memory_limit=UPLOADER_MEMORY_MB)
        # The stack owns config/policy.yaml: change caps in cdk.json and redeploy.
        s3deploy.BucketDeployment(self, "PolicyFile",
                                  sources=[s3deploy.Source.yaml_data("policy.yaml", self.policy_document(network))],
                                  destination_bucket=self.bucket, destination_key_prefix=f"{prefix}config/",
                                  prune=False, memory_limit=UPLOADER_MEMORY_MB)


@dataclass(frozen=True)
class Network:
    subnets: list[str]
    group: ec2.SecurityGroup
    placement: ec2.PlacementGroup
    public_ip: bool | None  # aws.public_ip in the policy


@dataclass(frozen=True)
class Egress:
    """How VMs in a new VPC reach beyond S3 (jobplane:network)."""

    subnet_type: ec2.SubnetType  # of the VMs' subnets
    nat_gateways: int
    public_ip: bool  # the launcher asks EC2 for a public IPv4 address per VM


JOB_SUBNETS = "jobs"  # the subnet group the VMs launch into
NETWORKS = {
    # Internet gateway, a public address per VM (the subnets assign none themselves), inbound only from
    # other jobplane VMs. No idle cost; each running VM's address is billed per hour.
    "public": Egress(ec2.SubnetType.PUBLIC, nat_gateways=0, public_ip=True),
    # No public addresses on VMs; one NAT gateway for the VPC, billed per hour even with no job running.
    "private-nat": Egress(ec2.SubnetType.PRIVATE_WITH_EGRESS, nat_gateways=1, public_ip=False),
    # No internet at all: S3 (same region) through the gateway endpoint only.
    "isolated": Egress(ec2.SubnetType.PRIVATE_ISOLATED, nat_gateways=0, public_ip=False),
}


RETENTION = {1: logs.RetentionDays.ONE_DAY, 7: logs.RetentionDays.ONE_WEEK, 14: logs.RetentionDays.TWO_WEEKS,
             30: logs.RetentionDays.ONE_MONTH, 90: logs.RetentionDays.THREE_MONTHS,
             180: logs.RetentionDays.SIX_MONTHS, 365: logs.RetentionDays.ONE_YEAR}


def _retention(days: int) -> logs.RetentionDays:
    if days not in RETENTION:
        raise ValueError(f"jobplane:logRetentionDays: {days} is not one of {sorted(RETENTION)}")
    return RETENTION[days]
