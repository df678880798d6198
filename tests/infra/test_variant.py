"""The context knobs: an existing VPC and subnets, a registry root prefix, custom schedules, no reserved
concurrency, the dashboard. One more synth (cdk-nag on: the acknowledgements must follow the prefix too)."""

from __future__ import annotations

import json

import pytest

from tests.infra.conftest import Synth, cdk_context, synthesize
from tests.infra.iam_eval import Request, allows, managed_policy_statements, role_statements

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]  # a cold cache downloads wheels

SUBNETS = ["subnet-0aaa1111", "subnet-0bbb2222"]
ARN = "arn:aws:ec2:us-east-1:123456789012"


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    context = cdk_context(**{
        "jobplane:vpcId": "vpc-0123abcd", "jobplane:subnetIds": ",".join(SUBNETS), "jobplane:root": "team-a",
        "jobplane:reservedConcurrency": "false", "jobplane:sweepSchedule": "rate(2 minutes)",
        "jobplane:bucketName": "acme-jobplane", "jobplane:dashboard": "true",
        "jobplane:containerRepositories": "train", "jobplane:ssh": "true",
    })
    return synthesize(tmp_path_factory.mktemp("cdk.out-variant"), context, nag=True)


def test_existing_vpc_is_used_and_no_network_is_created(variant: Synth) -> None:
    assert not variant.resources("AWS::EC2::VPC") and not variant.resources("AWS::EC2::Subnet")
    (sg,) = variant.resources("AWS::EC2::SecurityGroup").values()
    assert sg["Properties"]["VpcId"] == "vpc-0123abcd"
    launcher_role = variant.functions()["launcher"]["Properties"]["Role"]["Fn::GetAtt"][0]
    sts = role_statements(variant.template, launcher_role)
    for subnet in SUBNETS:
        assert allows(sts, Request("ec2:RunInstances", f"{ARN}:subnet/{subnet}"))
    assert not allows(sts, Request("ec2:RunInstances", f"{ARN}:subnet/subnet-other"))
    placement = variant.policy("team-a/config/").aws
    assert placement.subnets == SUBNETS
    assert placement.public_ip is None  # your subnets decide whether VMs get public addresses


def test_root_prefix_reaches_rules_env_vm_role_and_uploads(variant: Synth) -> None:
    (registry,) = [k for k in variant.resources("AWS::S3::Bucket") if "Registry" in k]
    assert variant.template["Resources"][registry]["Properties"]["BucketName"] == "acme-jobplane"
    keys = [r["Properties"]["EventPattern"]["detail"]["object"]["key"][0]
            for r in variant.resources("AWS::Events::Rule").values()
            if r["Properties"].get("EventPattern", {}).get("source") == ["aws.s3"]]
    assert sorted(str(k) for k in keys) == sorted(str(k) for k in [
        {"prefix": "team-a/queue/"}, {"prefix": "team-a/cancels/"}, {"prefix": "team-a/preempted-jobs/"},
        {"wildcard": "team-a/jobs/*/attempts/*/nodes/*/exit.json"}])
    for fn in variant.functions().values():
        assert fn["Properties"]["Environment"]["Variables"]["JOBPLANE_ROOT"] == "team-a"
        assert "ReservedConcurrentExecutions" not in fn["Properties"]
    job_role = variant.logical_id("AWS::IAM::Role", "JobRole")
    sts = role_statements(variant.template, job_role)
    assert allows(sts, Request("s3:PutObject", f"<{registry}.Arn>/team-a/heartbeats/j1/1/0"))
    assert not allows(sts, Request("s3:PutObject", f"<{registry}.Arn>/heartbeats/j1/1/0"))
    submitters = managed_policy_statements(variant.template, "SubmitterPolicy")
    vision = {"aws:PrincipalTag/jobplane-owner": "vision"}
    assert allows(submitters, Request("s3:PutObject", f"<{registry}.Arn>/team-a/queue/vision/x.yaml", vision))
    assert not allows(submitters, Request("s3:PutObject", f"<{registry}.Arn>/queue/vision/x.yaml", vision))
    prefixes = {d["Properties"]["DestinationBucketKeyPrefix"]
                for d in variant.resources("Custom::CDKBucketDeployment").values()}
    assert prefixes == {"team-a/system/agent/", "team-a/config/"}


def test_schedules_come_from_context(variant: Synth) -> None:
    expressions = sorted(r["Properties"]["ScheduleExpression"] for r in variant.resources("AWS::Events::Rule").values()
                         if "ScheduleExpression" in r["Properties"])
    assert expressions == ["rate(2 minutes)"] + ["rate(5 minutes)"] * 3


def test_the_dashboard_when_asked_for_shows_every_control_plane_metric(variant: Synth) -> None:
    (dashboard,) = variant.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in ("JobsLaunched", "JobsSucceeded", "JobsFailed", "Reruns", "OrphansTerminated", "HeldTerminated",
                   "Stalls", "Timeouts", "BlastRadiusRefusals", "CheckDuration", "LaunchCapacityErrors", "Errors",
                   "IdleGpuJobs", "NotificationsPublished", "NotificationsFailed"):
        assert metric in body, metric



def test_vms_pull_job_containers_from_the_named_ecr_repositories_only(variant: Synth) -> None:
    vm_role = variant.logical_id("AWS::IAM::Role", "VmRole")
    sts = role_statements(variant.template, vm_role)
    (pull,) = [s for s in sts if s.get("Sid") == "PullJobContainers"]
    assert sorted(pull["Action"]) == ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage",
                                      "ecr:GetDownloadUrlForLayer"]
    assert pull["Resource"] == {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":ecr:", {"Ref": "AWS::Region"},
                                                  ":", {"Ref": "AWS::AccountId"}, ":repository/train"]]}
    assert allows(sts, Request("ecr:GetAuthorizationToken", "*"))
    assert not any("ecr:PutImage" in json.dumps(s) or "ecr:*" in json.dumps(s) for s in sts)


def test_with_ssh_the_vm_role_alone_gets_session_manager_and_no_port_opens(variant: Synth) -> None:
    vm_role = variant.logical_id("AWS::IAM::Role", "VmRole")
    (session,) = [s for s in role_statements(variant.template, vm_role) if s.get("Sid") == "SessionManager"]
    assert sorted(session["Action"]) == ["ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel",
                                         "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel",
                                         "ssmmessages:OpenDataChannel"]
    granting = [p["Properties"] for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy")
                for p in variant.resources(kind).values()
                if "ssmmessages:" in json.dumps(p["Properties"]["PolicyDocument"])]
    assert [p["Roles"] for p in granting] == [[{"Ref": vm_role}]]  # one policy, on the VM role only
    assert "ssm" not in json.dumps([r["Properties"].get("ManagedPolicyArns", [])  # AmazonSSMManagedInstanceCore
                                    for r in variant.resources("AWS::IAM::Role").values()]).lower()
    ingress = [r["Properties"] for r in variant.resources("AWS::EC2::SecurityGroupIngress").values()]
    for sg in variant.resources("AWS::EC2::SecurityGroup").values():
        ingress += sg["Properties"].get("SecurityGroupIngress", [])
    assert ingress and all("SourceSecurityGroupId" in rule and "CidrIp" not in rule and "CidrIpv6" not in rule
                           for rule in ingress), ingress  # only from the VMs themselves
