"""Assertions on the synthesized template: every resource, rule and IAM condition issue 6 asks for."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml

from jobplane.boot import agent_bundle
from jobplane.model import images
from tests.infra.conftest import ALARM_EMAIL, DATA_BUCKET, NOTIFY_EMAIL, Synth, cdk_context
from tests.infra.iam_eval import Request, allows, managed_policy_statements, resolve, role_statements

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]  # a cold cache downloads wheels

ARN = "arn:aws:ec2:us-east-1:123456789012"
MANAGED = {"aws:ResourceTag/jobplane:managed": "true"}
REQUEST_MANAGED = {"aws:RequestTag/jobplane:managed": "true"}
HANDLERS = ("launcher", "sweeper", "rerun", "uptime_cap")


def ours(synth: Synth, kind: str = "ResourceTag") -> dict[str, str]:
    """Both ownership tags of this deployment: managed, and its registry (the bucket's name, resolved)."""
    return {f"aws:{kind}/jobplane:managed": "true", f"aws:{kind}/jobplane:deployment": f"<{bucket_id(synth)}>"}


def bucket_id(synth: Synth) -> str:
    return synth.logical_id("AWS::S3::Bucket", "Registry")


def fn_role(synth: Synth, name: str) -> str:
    return str(synth.functions()[name]["Properties"]["Role"]["Fn::GetAtt"][0])


def statements(synth: Synth, name: str) -> list[dict[str, Any]]:
    return role_statements(synth.template, fn_role(synth, name))


# ---- registry bucket --------------------------------------------------------------------------------
def test_registry_bucket_is_versioned_private_encrypted_logged_and_emits_events(synth: Synth) -> None:
    bid = bucket_id(synth)
    props = synth.template["Resources"][bid]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"}
    assert props["LoggingConfiguration"]["DestinationBucketName"] == {
        "Ref": synth.logical_id("AWS::S3::Bucket", "AccessLogs")}
    (notifications,) = synth.resources("Custom::S3BucketNotifications").values()
    assert notifications["Properties"]["BucketName"] == {"Ref": bid}
    assert "EventBridgeConfiguration" in notifications["Properties"]["NotificationConfiguration"]
    # retained on stack deletion: the registry is the only copy of every job's history
    assert synth.template["Resources"][bid]["DeletionPolicy"] == "Retain"


def test_access_logs_are_versioned_and_kept_a_year(synth: Synth) -> None:
    props = synth.template["Resources"][synth.logical_id("AWS::S3::Bucket", "AccessLogs")]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}  # a deleted log can still be read 30 days
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    assert rules["ExpireAccessLogs"]["ExpirationInDays"] == 365
    assert rules["ExpireAccessLogs"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30}
    assert rules["DropExpiredDeleteMarkers"]["ExpiredObjectDeleteMarker"] is True


def test_bucket_policies_deny_plain_http(synth: Synth) -> None:
    for policy in synth.resources("AWS::S3::BucketPolicy").values():
        denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
        assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in denies)
    assert len(synth.resources("AWS::S3::BucketPolicy")) == 2  # registry and access logs


def test_lifecycle_expires_old_log_chunks_and_heartbeat_history(synth: Synth) -> None:
    rules = {r["Id"]: r for r in
             synth.template["Resources"][bucket_id(synth)]["Properties"]["LifecycleConfiguration"]["Rules"]}
    assert rules["ExpireOldLogChunks"]["TagFilters"] == [{"Key": "jobplane:object", "Value": "log"}]
    assert rules["ExpireOldLogChunks"]["ExpirationInDays"] == 90
    assert rules["DropHeartbeatHistory"]["Prefix"] == "heartbeats/"
    assert rules["DropHeartbeatHistory"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    assert rules["DropOldVersions"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}


# ---- functions --------------------------------------------------------------------------------------
def test_four_functions_and_vend_arm64_newest_python_json_logs_xray_dlq(synth: Synth) -> None:
    fns = synth.functions()
    assert sorted(fns) == sorted((*HANDLERS, "vend"))
    dlq = synth.logical_id("AWS::SQS::Queue", "DeadLetters")
    for name, fn in fns.items():
        p = fn["Properties"]
        assert p["Runtime"] == "python3.14", name
        assert p["Architectures"] == ["arm64"], name
        assert p["TracingConfig"] == {"Mode": "Active"}, name
        assert p["LoggingConfig"]["LogFormat"] == "JSON", name
        if name != "vend":  # vend is called synchronously, through its URL: there is nothing to dead-letter
            assert p["DeadLetterConfig"] == {"TargetArn": {"Fn::GetAtt": [dlq, "Arn"]}}, name
        assert p["Handler"] == f"functions.aws.{name}.handler"
        env = p["Environment"]["Variables"]
        assert env["JOBPLANE_BUCKET"] == {"Ref": bucket_id(synth)}
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "jobplane" and env["PYDANTIC_DISABLE_PLUGINS"] == "__all__"
        assert p["LoggingConfig"]["LogGroup"]["Ref"] in synth.resources("AWS::Logs::LogGroup")


def test_every_function_has_reserved_concurrency_bounding_its_runs(synth: Synth) -> None:
    """One run at a time for each reconciler; drops in parallel, but a flood of them (or of VMs asking vend) takes
    at most 10 (20) of the account's concurrency, as GCP's max_instance_count bounds the same functions."""
    reserved = {name: fn["Properties"].get("ReservedConcurrentExecutions") for name, fn in synth.functions().items()}
    assert reserved == {"launcher": 10, "sweeper": 1, "rerun": 1, "uptime_cap": 1, "vend": 20}


def test_async_invocations_retry_briefly_then_dead_letter(synth: Synth) -> None:
    configs = synth.resources("AWS::Lambda::EventInvokeConfig").values()
    assert len(configs) == 4
    for cfg in configs:
        assert cfg["Properties"]["MaximumRetryAttempts"] == 2
        assert cfg["Properties"]["MaximumEventAgeInSeconds"] == 3600
    (queue,) = synth.resources("AWS::SQS::Queue").values()
    assert queue["Properties"]["SqsManagedSseEnabled"] is True


# ---- rules and schedules ----------------------------------------------------------------------------
def rules_for(synth: Synth, name: str) -> list[dict[str, Any]]:
    fn_id = synth.logical_id("AWS::Lambda::Function", {"uptime_cap": "UptimeCap"}.get(name, name.title()))
    return [r["Properties"] for r in synth.resources("AWS::Events::Rule").values()
            if any(t["Arn"] == {"Fn::GetAtt": [fn_id, "Arn"]} for t in r["Properties"]["Targets"])]


def patterns(synth: Synth, name: str) -> list[dict[str, Any]]:
    return [r["EventPattern"] for r in rules_for(synth, name) if "EventPattern" in r]


def test_queue_drops_and_cancel_requests_trigger_the_launcher(synth: Synth) -> None:
    drops, cancels = patterns(synth, "launcher")
    for pattern, prefix in ((drops, "queue/"), (cancels, "cancels/")):
        assert pattern["source"] == ["aws.s3"] and pattern["detail-type"] == ["Object Created"]
        assert pattern["detail"] == {"bucket": {"name": [{"Ref": bucket_id(synth)}]},
                                     "object": {"key": [{"prefix": prefix}]}}


def test_exit_reports_boot_failures_and_instance_state_changes_trigger_the_sweeper(synth: Synth) -> None:
    by_source = {p["source"][0]: p for p in patterns(synth, "sweeper")}
    assert by_source["aws.s3"]["detail"]["object"]["key"] == [{"wildcard": "jobs/*/attempts/*/nodes/*/exit.json"},
                                                              {"wildcard": "jobs/*/attempts/*/boot-failure.json"}]
    assert by_source["aws.ec2"]["detail-type"] == ["EC2 Instance State-change Notification"]
    assert set(by_source["aws.ec2"]["detail"]["state"]) == {"shutting-down", "terminated", "stopping", "stopped"}


def test_spot_warnings_and_preempted_markers_trigger_rerun(synth: Synth) -> None:
    by_source = {p["source"][0]: p for p in patterns(synth, "rerun")}
    assert by_source["aws.ec2"]["detail-type"] == ["EC2 Spot Instance Interruption Warning"]
    assert by_source["aws.s3"]["detail"]["object"]["key"] == [{"prefix": "preempted-jobs/"}]


def test_one_schedule_per_cron_from_context_and_every_target_dead_letters(synth: Synth) -> None:
    context = cdk_context()
    keys = {"launcher": "launcherBackstopSchedule", "sweeper": "sweepSchedule", "rerun": "rerunSchedule",
            "uptime_cap": "uptimeCapSchedule"}
    dlq = synth.logical_id("AWS::SQS::Queue", "DeadLetters")
    for name in HANDLERS:
        schedules = [r["ScheduleExpression"] for r in rules_for(synth, name) if "ScheduleExpression" in r]
        assert schedules == [context[f"jobplane:{keys[name]}"]], name
        for rule in rules_for(synth, name):
            (target,) = rule["Targets"]
            assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [dlq, "Arn"]}}
    assert len(synth.resources("AWS::Events::Rule")) == 10


# ---- launch and terminate permissions (evaluated on the synthesized policies) -----------------------
@pytest.mark.parametrize("action", ["ec2:TerminateInstances", "ec2:GetConsoleOutput"])
@pytest.mark.parametrize("name", ["sweeper", "uptime_cap", "rerun"])
def test_terminate_and_read_the_console_only_of_instances_tagged_managed(synth: Synth, name: str, action: str) -> None:
    sts = statements(synth, name)
    instance = f"{ARN}:instance/i-0123456789abcdef0"
    assert allows(sts, Request(action, instance, ours(synth)))
    assert not allows(sts, Request(action, instance, MANAGED)), "another deployment's VM (or one without the tag)"
    assert not allows(sts, Request(action, instance, {**MANAGED, "aws:ResourceTag/jobplane:deployment": "staging"}))
    assert not allows(sts, Request(action, instance, {}))
    assert not allows(sts, Request(action, instance, {"aws:ResourceTag/jobplane:managed": "false"}))
    assert not allows(sts, Request(action, instance, {"aws:ResourceTag/jobplane:managed": "TRUE"}))


def test_every_terminate_grant_in_the_template_carries_the_managed_condition(synth: Synth) -> None:
    for policy in synth.resources("AWS::IAM::Policy").values():
        for st in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            if any(a in ("*", "ec2:*") or a.startswith("ec2:Terminate") for a in actions):
                assert resolve(st["Condition"]) == {"StringEquals": ours(synth)}, st
                assert resolve(st["Resource"]) == f"{ARN}:instance/*"


def test_launcher_cannot_terminate(synth: Synth) -> None:
    assert not allows(statements(synth, "launcher"),
                      Request("ec2:TerminateInstances", f"{ARN}:instance/i-1", ours(synth)))


@pytest.mark.parametrize("name", HANDLERS)
def test_run_instances_requires_the_managed_tag_in_the_request(synth: Synth, name: str) -> None:
    sts = statements(synth, name)
    request_ours = ours(synth, "RequestTag")
    for resource in ("instance/*", "volume/*"):
        arn = f"{ARN}:{resource.replace('*', 'x-1')}"
        assert allows(sts, Request("ec2:RunInstances", arn, request_ours))
        assert not allows(sts, Request("ec2:RunInstances", arn, REQUEST_MANAGED)), "without this deployment's tag"
        assert not allows(sts, Request("ec2:RunInstances", arn, {}))
        assert not allows(sts, Request("ec2:RunInstances", arn, {"aws:RequestTag/jobplane:managed": "false"}))
    # tags only as part of RunInstances, never on an existing resource
    tag_ctx = {**request_ours, "ec2:CreateAction": "RunInstances"}
    assert allows(sts, Request("ec2:CreateTags", f"{ARN}:instance/i-1", tag_ctx))
    assert not allows(sts, Request("ec2:CreateTags", f"{ARN}:instance/i-1", request_ours))


@pytest.mark.parametrize("name", HANDLERS)
def test_launches_only_into_the_stacks_network(synth: Synth, name: str) -> None:
    sts = statements(synth, name)
    sg = synth.logical_id("AWS::EC2::SecurityGroup", "JobSecurityGroup")
    assert allows(sts, Request("ec2:RunInstances", f"{ARN}:security-group/<{sg}.GroupId>"))
    assert not allows(sts, Request("ec2:RunInstances", f"{ARN}:security-group/sg-someone-elses"))
    subnets = [k for k in synth.resources("AWS::EC2::Subnet")]
    for subnet in subnets:
        assert allows(sts, Request("ec2:RunInstances", f"{ARN}:subnet/<{subnet}>"))
    assert not allows(sts, Request("ec2:RunInstances", f"{ARN}:subnet/subnet-elsewhere"))


@pytest.mark.parametrize("name", HANDLERS)
def test_pass_role_only_for_the_vm_role_to_ec2(synth: Synth, name: str) -> None:
    vm_role = synth.logical_id("AWS::IAM::Role", "VmRole")
    sts = statements(synth, name)
    to_ec2 = {"iam:PassedToService": "ec2.amazonaws.com"}
    assert allows(sts, Request("iam:PassRole", f"<{vm_role}.Arn>", to_ec2))
    assert not allows(sts, Request("iam:PassRole", f"<{vm_role}.Arn>", {"iam:PassedToService": "lambda.amazonaws.com"}))
    for other in synth.resources("AWS::IAM::Role"):
        if other != vm_role:
            assert not allows(sts, Request("iam:PassRole", f"<{other}.Arn>", to_ec2))


@pytest.mark.parametrize("name", HANDLERS)
def test_launchers_read_image_parameters_public_and_own_only(synth: Synth, name: str) -> None:
    sts = statements(synth, name)
    public = "arn:aws:ssm:us-east-1::parameter" + images.ALIASES["debian-12"].aws[images.X86_64]
    assert allows(sts, Request("ssm:GetParameter", public))
    assert allows(sts, Request("ssm:GetParameter", "arn:aws:ssm:us-east-1:123456789012:parameter/team/gpu-ami"))
    assert not allows(sts, Request("ssm:GetParameter", "arn:aws:ssm:us-east-1:999999999999:parameter/other"))
    assert not allows(sts, Request("ssm:PutParameter", "arn:aws:ssm:us-east-1:123456789012:parameter/team/gpu-ami"))


@pytest.mark.parametrize("name", HANDLERS)
def test_launchers_read_spot_prices_for_the_cost_of_what_they_launch(synth: Synth, name: str) -> None:
    reads = allows(statements(synth, name), Request("ec2:DescribeSpotPriceHistory", "*"))
    assert reads, name


@pytest.mark.parametrize("name", ["sweeper", "uptime_cap"])
def test_reconcilers_launch_what_an_attempts_end_admits_but_only_managed_vms(synth: Synth, name: str) -> None:
    """A run that ends an attempt admits the jobs waiting for its nodes (control.reconcile.apply), so it launches."""
    assert allows(statements(synth, name), Request("ec2:RunInstances", f"{ARN}:instance/x", ours(synth, "RequestTag")))
    assert not allows(statements(synth, name), Request("ec2:RunInstances", f"{ARN}:instance/x", REQUEST_MANAGED))


# ---- the VM's identity ------------------------------------------------------------------------------
def vm_statements(synth: Synth) -> list[dict[str, Any]]:
    return role_statements(synth.template, synth.logical_id("AWS::IAM::Role", "VmRole"))


def job_statements(synth: Synth) -> list[dict[str, Any]]:
    """The job role's: what any agent's vended credentials may do at most (each session narrows it to one job)."""
    return role_statements(synth.template, synth.logical_id("AWS::IAM::Role", "JobRole"))


def test_vm_role_is_for_ec2_with_an_instance_profile(synth: Synth) -> None:
    vm_role = synth.logical_id("AWS::IAM::Role", "VmRole")
    trust = synth.template["Resources"][vm_role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "ec2.amazonaws.com"}]
    (profile,) = synth.resources("AWS::IAM::InstanceProfile").values()
    assert profile["Properties"]["Roles"] == [{"Ref": vm_role}]


def test_job_role_has_no_ec2_no_iam_and_only_registry_reads_and_writes(synth: Synth) -> None:
    sts = job_statements(synth)
    actions = {a for s in sts for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
    assert actions <= {"s3:GetObject", "s3:PutObject", "s3:PutObjectTagging", "s3:ListBucket", "s3:DeleteObject",
                       "s3:AbortMultipartUpload", "ssm:GetParameter"}
    # secrets: read only, and only the deployment's parameters (each session names exactly its job's)
    assert [s["Resource"] for s in sts if "ssm:GetParameter" in s["Action"]] == ["arn:*:ssm:*:*:parameter/jobplane/*"]
    obj = f"<{bucket_id(synth)}.Arn>/"
    for key in ("jobs/j1/job.json", "jobs/j1/code/code.tar.gz", "code/team-a/j1.tar.gz",
                "jobs/j1/checkpoints/step-100.pt", "jobs/j1/attempts/2/cluster.json", "jobs/j1/control/stop"):
        assert allows(sts, Request("s3:GetObject", obj + key)), key
    for key in ("heartbeats/j1/2/0", "heartbeats/j1/2/0.output", "heartbeats/j1/2/0.idle",
                "jobs/j1/logs/2/0/00000001.log", "jobs/j1/metrics/2/0/00000001.jsonl",
                "jobs/j1/system/2/0/00000001.jsonl", "jobs/j1/tensorboard/2/0/train/events.out.tfevents.1",
                "jobs/j1/checkpoints/step-100.pt", "jobs/j1/artifacts/model/w.bin",
                "jobs/j1/attempts/2/nodes/0/exit.json", "preempted-jobs/j1"):
        assert allows(sts, Request("s3:PutObject", obj + key)), key
    # never the control plane's own keys
    for key in ("jobs/j1/job.json", "active/j1/RUNNING.2", "queue/j2.yaml", "config/policy.yaml",
                "jobs/j1/attempts/2/cluster.json", "jobs/j1/control/stop", "system/agent/manifest.json",
                "jobs/j1/attempts/2/boot-failure.json", "limits/j1/2/idle-flagged", "code/team-a/j1.tar.gz",
                "active/j1/RUNNING.2.nodes-1.stall-60.cap-3600", "active/j1.2.idle-flagged",
                "active/j1.2.held-until-1800000000"):  # a job's VM never forges its own limits, flag or hold
        assert not allows(sts, Request("s3:PutObject", obj + key)), key
    for key in ("config/policy.yaml", "rejected/j2.yaml", "queue/j2.yaml", "active/j1/RUNNING.2"):
        assert not allows(sts, Request("s3:GetObject", obj + key)), key
    # the agent bundles are readable (the session policy's read-only keys); the VM's role itself reads none
    assert allows(sts, Request("s3:GetObject", obj + "system/agent/aws-py3.12-x86_64.tar.gz"))
    # deletes only where the agent prunes what its newest manifest no longer names
    for key in ("jobs/j1/checkpoints/files/0/3/ckpt-100.pt", "jobs/j1/artifacts/model/w.bin"):
        assert allows(sts, Request("s3:DeleteObject", obj + key)), key
        assert allows(sts, Request("s3:AbortMultipartUpload", obj + key)), key
    for key in ("jobs/j1/job.json", "jobs/j1/logs/2/0/00000001.log", "heartbeats/j1/2/0", "queue/j2.yaml",
                "jobs/j1/attempts/2/nodes/0/exit.json", "preempted-jobs/j1"):
        assert not allows(sts, Request("s3:DeleteObject", obj + key)), key
    # the tag the log-chunk lifecycle rule filters on: log, metrics and system metrics chunks only
    for key in ("jobs/j1/logs/2/0/00000001.log", "jobs/j1/metrics/2/0/00000001.jsonl",
                "jobs/j1/system/2/0/00000001.jsonl"):
        assert allows(sts, Request("s3:PutObjectTagging", obj + key)), key
    assert not allows(sts, Request("s3:PutObjectTagging", obj + "jobs/j1/tensorboard/2/0/events.out.tfevents.1"))
    assert not allows(sts, Request("s3:PutObjectTagging", obj + "jobs/j1/checkpoints/step-100.pt"))


def test_a_vms_own_identity_reads_declared_input_buckets_read_only_and_a_jobs_credentials_never(synth: Synth) -> None:
    sts = role_statements(synth.template, synth.logical_id("AWS::IAM::Role", "VmRole"))
    assert allows(sts, Request("s3:GetObject", f"arn:aws:s3:::{DATA_BUCKET}/regression/train/part-0"))
    assert not allows(sts, Request("s3:PutObject", f"arn:aws:s3:::{DATA_BUCKET}/x"))
    assert not allows(sts, Request("s3:GetObject", "arn:aws:s3:::someone-elses-bucket/x"))
    job = role_statements(synth.template, synth.logical_id("AWS::IAM::Role", "JobRole"))
    assert not allows(job, Request("s3:GetObject", f"arn:aws:s3:::{DATA_BUCKET}/regression/train/part-0"))


# ---- network ----------------------------------------------------------------------------------------
def test_cluster_placement_group_and_security_group_only_between_job_vms(synth: Synth) -> None:
    (pg,) = synth.resources("AWS::EC2::PlacementGroup").values()
    assert pg["Properties"]["Strategy"] == "cluster"
    sg = synth.logical_id("AWS::EC2::SecurityGroup", "JobSecurityGroup")
    assert "SecurityGroupIngress" not in synth.template["Resources"][sg]["Properties"]
    (ingress,) = synth.resources("AWS::EC2::SecurityGroupIngress").values()
    assert ingress["Properties"]["SourceSecurityGroupId"] == {"Fn::GetAtt": [sg, "GroupId"]}
    assert ingress["Properties"]["GroupId"] == {"Fn::GetAtt": [sg, "GroupId"]}


# ---- deploy-time uploads ----------------------------------------------------------------------------
def test_policy_yaml_points_launches_at_the_stacks_resources(synth: Synth) -> None:
    props = synth.deployments()["config/"]
    assert props["Prune"] is False and props["DestinationBucketName"] == {"Ref": bucket_id(synth)}
    text = synth.policy_text()
    policy = synth.policy()
    assert policy.aws.instance_profile == f"<{synth.logical_id('AWS::IAM::InstanceProfile', 'Vm')}>"
    assert policy.aws.subnets == [f"<{s}>" for s in synth.resources("AWS::EC2::Subnet")]
    assert policy.aws.security_groups == [f"<{synth.logical_id('AWS::EC2::SecurityGroup', 'Job')}.GroupId>"]
    assert policy.aws.placement_group == f"<{synth.logical_id('AWS::EC2::PlacementGroup', 'Cluster')}.GroupName>"
    caps = cdk_context()["jobplane:policy"]
    assert policy.max_nodes_per_job == caps["max_nodes_per_job"]
    assert policy.safety.max_terminations_per_run == caps["safety"]["max_terminations_per_run"]
    assert yaml.safe_load(io.StringIO(text))["allowed_instance_types"] == caps["allowed_instance_types"]


def test_agent_bundles_go_to_system_agent_and_new_policies_boot_the_image_aliases(synth: Synth) -> None:
    props = synth.deployments()["system/agent/"]
    assert props["Prune"] is True
    (key,) = props["SourceObjectKeys"]
    manifest = agent_bundle.parse_manifest((synth.asset_dir(key) / agent_bundle.MANIFEST).read_bytes())
    assert {(v.python, v.arch) for v in manifest} == {(p, a) for p in ("3.11", "3.12") for a in images.ARCHITECTURES}
    caps = cdk_context()["jobplane:policy"]["aws"]
    assert (caps["default_image"], caps["default_gpu_image"]) == (images.DEFAULT_CPU, images.DEFAULT_GPU)


# ---- observability and outputs ----------------------------------------------------------------------
def test_alarms_for_errors_dlq_and_blast_radius_go_to_the_topic(synth: Synth) -> None:
    topic = synth.logical_id("AWS::SNS::Topic", "AlarmTopic")
    alarms = list(synth.resources("AWS::CloudWatch::Alarm").values())
    for alarm in alarms:
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic}]
    errors = [a for a in alarms if a["Properties"].get("MetricName") == "Errors"]
    assert {a["Properties"]["Dimensions"][0]["Value"]["Ref"] for a in errors} == {
        synth.logical_id("AWS::Lambda::Function", n) for n in ("Launcher", "Sweeper", "Rerun", "UptimeCap")}
    names = {a["Properties"].get("MetricName") for a in alarms}
    assert {"ApproximateNumberOfMessagesVisible", "BlastRadiusRefusals"} <= names
    (sub,) = [s["Properties"] for s in synth.resources("AWS::SNS::Subscription").values()
              if s["Properties"]["TopicArn"] == {"Ref": topic}]
    assert sub["Endpoint"] == ALARM_EMAIL and sub["Protocol"] == "email"


def test_no_dashboard_unless_asked_for(synth: Synth) -> None:
    assert synth.resources("AWS::CloudWatch::Dashboard") == {}  # $3/month: jobplane:dashboard turns it on


# ---- job notifications and submitters ----------------------------------------------------------------
def test_job_notifications_go_to_an_encrypted_topic_only_the_functions_publish_to(synth: Synth) -> None:
    topic = synth.logical_id("AWS::SNS::Topic", "Notifications")
    assert resolve(synth.template["Resources"][topic]["Properties"]["KmsMasterKeyId"]).endswith("alias/aws/sns")
    (sub,) = [s["Properties"] for s in synth.resources("AWS::SNS::Subscription").values()
              if s["Properties"]["TopicArn"] == {"Ref": topic}]
    assert sub["Endpoint"] == NOTIFY_EMAIL and sub["Protocol"] == "email"
    publish = Request("sns:Publish", f"<{topic}>")
    for name in HANDLERS:
        fn = synth.functions()[name]
        assert fn["Properties"]["Environment"]["Variables"]["JOBPLANE_NOTIFY_TOPIC"] == {"Ref": topic}
        assert allows(statements(synth, name), publish), name
    assert not allows(vm_statements(synth), publish) and not allows(statements(synth, "vend"), publish)
    alarm_topic = synth.logical_id("AWS::SNS::Topic", "AlarmTopic")
    assert not any(allows(statements(synth, name), Request("sns:Publish", f"<{alarm_topic}>")) for name in HANDLERS)


def test_the_submitter_policy_lets_a_principal_write_only_under_its_own_owner(synth: Synth) -> None:
    sts = managed_policy_statements(synth.template, "SubmitterPolicy")
    obj = f"<{bucket_id(synth)}.Arn>/"
    team_a = {"aws:PrincipalTag/jobplane-owner": "team-a"}

    def put(key: str, context: dict[str, str]) -> bool:
        return allows(sts, Request("s3:PutObject", obj + key, context))

    assert put("queue/team-a/train-1.yaml", team_a) and put("code/team-a/train-1.tar.gz", team_a)
    for key in ("queue/team-b/train-1.yaml", "code/team-b/train-1.tar.gz", "queue/train-1.yaml",
                "jobs/train-1/job.json", "jobs/train-1/control/stop", "active/train-1/RUNNING.1",
                "config/policy.yaml", "heartbeats/train-1/1/0"):
        assert not put(key, team_a), key
    assert not put("queue/team-a/train-1.yaml", {})  # an untagged principal writes nothing
    for key in ("jobs/train-1/job.json", "jobs/train-1/logs/1/0/00000000.log", "queue/team-b/x.yaml",
                "rejected/x.error.json"):
        assert allows(sts, Request("s3:GetObject", obj + key, team_a)), key
    assert not allows(sts, Request("s3:GetObject", obj + "system/agent/manifest.json", team_a))
    assert not allows(sts, Request("s3:DeleteObject", obj + "queue/team-a/train-1.yaml", team_a))
    assert allows(sts, Request("s3:ListBucket", f"<{bucket_id(synth)}.Arn>", team_a))


def test_outputs_bucket_name_and_submit_command(synth: Synth) -> None:
    outputs = {k: v["Value"] for k, v in synth.template["Outputs"].items()}
    values = [json.dumps(v) for v in outputs.values()]
    assert {"Ref": bucket_id(synth)} in outputs.values()
    assert any("jobplane submit job.yaml" in v for v in values)
    assert {"Ref": synth.logical_id("AWS::SNS::Topic", "Notifications")} in outputs.values()
    assert {"Ref": synth.logical_id("AWS::IAM::ManagedPolicy", "SubmitterPolicy")} in outputs.values()
