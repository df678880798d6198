"""Job-scoped credentials in the template: the VM's own role reaches no job's keys and may only ask the vending
function (through its IAM-authenticated URL); the job role, trusted by that function's role alone, holds the
agents' grants; the function may assume it, read job records and see instance tags, nothing more."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.conftest import DATA_BUCKET, Synth
from tests.infra.iam_eval import Request, allows, resolve, role_statements

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]  # a cold cache downloads wheels


def role(synth: Synth, name: str) -> str:
    return synth.logical_id("AWS::IAM::Role", name)


def statements(synth: Synth, name: str) -> list[dict[str, Any]]:
    return role_statements(synth.template, role(synth, name))


def registry(synth: Synth) -> str:
    return synth.logical_id("AWS::S3::Bucket", "Registry")


def vend_function(synth: Synth) -> str:
    return synth.logical_id("AWS::Lambda::Function", "Vend")


def test_the_vm_role_reaches_no_jobs_keys(synth: Synth) -> None:
    sts = statements(synth, "VmRole")
    obj = f"<{registry(synth)}.Arn>/"
    for key in ("jobs/j1/job.json", "jobs/j1/code/code.tar.gz", "code/team-a/j1.tar.gz", "heartbeats/j1/1/0",
                "jobs/j1/logs/1/0/00000000.log", "jobs/j1/checkpoints/step-1.pt", "preempted-jobs/j1",
                "jobs/j1/attempts/1/cluster.json", "system/agent/manifest.json"):
        for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
            assert not allows(sts, Request(action, obj + key)), (action, key)
    assert not allows(sts, Request("s3:ListBucket", f"<{registry(synth)}.Arn>"))
    actions = {a for s in sts for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
    assert actions == {"lambda:InvokeFunctionUrl", "s3:GetObject", "s3:ListBucket"}  # the last two: input data only
    assert all(DATA_BUCKET in str(resolve(s["Resource"])) for s in sts if s["Action"] != "lambda:InvokeFunctionUrl")


def test_the_vm_role_may_only_call_the_vend_functions_url_with_iam_auth(synth: Synth) -> None:
    sts = statements(synth, "VmRole")
    fn = f"<{vend_function(synth)}.Arn>"
    assert allows(sts, Request("lambda:InvokeFunctionUrl", fn, {"lambda:FunctionUrlAuthType": "AWS_IAM"}))
    assert not allows(sts, Request("lambda:InvokeFunctionUrl", fn, {"lambda:FunctionUrlAuthType": "NONE"}))
    assert not allows(sts, Request("lambda:InvokeFunction", fn))
    for other in synth.resources("AWS::Lambda::Function"):
        if other != vend_function(synth):
            assert not allows(sts, Request("lambda:InvokeFunctionUrl", f"<{other}.Arn>",
                                           {"lambda:FunctionUrlAuthType": "AWS_IAM"}))


def test_the_vend_function_url_uses_aws_iam(synth: Synth) -> None:
    (url,) = synth.resources("AWS::Lambda::Url").values()
    assert url["Properties"]["AuthType"] == "AWS_IAM"
    assert url["Properties"]["TargetFunctionArn"] == {"Fn::GetAtt": [vend_function(synth), "Arn"]}
    assert synth.template["Resources"][vend_function(synth)]["Properties"]["Handler"] == "functions.aws.vend.handler"
    # the launchers (every control function: an attempt's end admits waiting jobs) hand the URL to the VMs they start
    expected = {"Fn::GetAtt": [synth.logical_id("AWS::Lambda::Url", "Vend"), "FunctionUrl"]}
    for name in ("launcher", "sweeper", "rerun", "uptime_cap"):
        assert synth.functions()[name]["Properties"]["Environment"]["Variables"]["JOBPLANE_VEND_URL"] == expected


def test_the_job_role_trusts_only_the_vend_functions_role(synth: Synth) -> None:
    trust = synth.template["Resources"][role(synth, "JobRole")]["Properties"]["AssumeRolePolicyDocument"]
    assert [(s["Effect"], s["Action"], s["Principal"]) for s in trust["Statement"]] == [
        ("Allow", "sts:AssumeRole", {"AWS": {"Fn::GetAtt": [role(synth, "VendRole"), "Arn"]}})]
    assert synth.template["Resources"][role(synth, "JobRole")]["Properties"]["MaxSessionDuration"] == 3600
    job_arn = f"<{role(synth, 'JobRole')}.Arn>"
    assert allows(statements(synth, "VendRole"), Request("sts:AssumeRole", job_arn))
    for other in ("VmRole", "LauncherRole", "SweeperRole", "RerunRole", "UptimeCapRole"):
        assert not allows(statements(synth, other), Request("sts:AssumeRole", job_arn)), other


def test_the_vend_function_reads_job_records_and_instance_tags_only(synth: Synth) -> None:
    sts = statements(synth, "VendRole")
    obj = f"<{registry(synth)}.Arn>/"
    assert allows(sts, Request("s3:GetObject", obj + "jobs/j1/job.json"))
    assert allows(sts, Request("ec2:DescribeInstances", "*"))
    for key in ("jobs/j1/logs/1/0/00000000.log", "config/policy.yaml", "jobs/j1/checkpoints/step-1.pt"):
        assert not allows(sts, Request("s3:GetObject", obj + key)), key
    assert not allows(sts, Request("s3:PutObject", obj + "jobs/j1/job.json"))
    assert not allows(sts, Request("ec2:TerminateInstances", "arn:aws:ec2:us-east-1:123456789012:instance/i-1"))
    env = synth.template["Resources"][vend_function(synth)]["Properties"]["Environment"]["Variables"]
    assert env["JOBPLANE_VM_ROLE_ARN"] == {"Fn::GetAtt": [role(synth, "VmRole"), "Arn"]}
    assert env["JOBPLANE_JOB_ROLE_ARN"] == {"Fn::GetAtt": [role(synth, "JobRole"), "Arn"]}
    assert "JOBPLANE_DATA_BUCKETS" not in env  # a job's credentials never reach input data: its VM's identity does
    assert not any(DATA_BUCKET in str(resolve(s["Resource"])) for s in statements(synth, "JobRole"))


def test_a_deployment_whose_root_could_overflow_a_jobs_session_policy_is_not_synthesized() -> None:
    """AWS refuses a session policy over 2,048 characters; the stack is sized for the longest job id, owner and
    code bundle name a spec may have (jobplane.vending.aws_iam.check_fits), before any resource is made. Data
    buckets take no room in it: a job's VM reads them with its own identity."""
    import aws_cdk as cdk

    from infra.aws.config import ControlPlaneConfig
    from infra.aws.control_plane import JobplaneControlPlane

    with pytest.raises(ValueError, match=r"^jobplane:root: the registry root '(r){80}/' makes a job's session "
                                         r"policy up to 2\d{3} characters, over AWS's 2048"):
        JobplaneControlPlane(cdk.Stack(cdk.App(), "Tight"), "ControlPlane", ControlPlaneConfig(root="r" * 80))
