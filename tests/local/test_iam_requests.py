"""The checks one request to the local moto makes (jobplane.local.iam_requests), as AWS's authorization makes them."""

from __future__ import annotations

from jobplane.local.iam_requests import Check, Ec2State, checks

ARN = "arn:aws:ec2:us-east-1:123456789012:"
STATE = Ec2State(instance_tags=lambda i: {"jobplane:managed": "true"} if i == "i-1" else {},
                 default_group=lambda subnet: "sg-default" if subnet else None,
                 profile_roles=lambda p: ["arn:aws:iam::123456789012:role/jobplane-vm"] if p == "vm" else [])


def ec2(action: str, **params: str) -> list[Check]:
    return checks("ec2", action, {k: [v] for k, v in params.items()}, "us-east-1", "123456789012", STATE)


def test_run_instances_is_checked_on_each_resource_it_makes_and_uses_with_its_tags_and_passed_role() -> None:
    found = ec2("RunInstances", ImageId="ami-1", **{
        "NetworkInterface.1.SubnetId": "subnet-1", "InstanceMarketOptions.MarketType": "spot",
        "IamInstanceProfile.Name": "vm", "TagSpecification.1.ResourceType": "instance",
        "TagSpecification.1.Tag.1.Key": "jobplane:managed", "TagSpecification.1.Tag.1.Value": "true",
        "TagSpecification.1.Tag.2.Key": "jobplane:job-id", "TagSpecification.1.Tag.2.Value": "j"})
    tags = {"aws:RequestTag/jobplane:managed": "true", "aws:RequestTag/jobplane:job-id": "j"}
    assert Check("ec2:RunInstances", f"{ARN}instance/*", tags) in found
    assert Check("ec2:RunInstances", f"{ARN}volume/*", {}) in found
    assert Check("ec2:CreateTags", f"{ARN}instance/*", {"ec2:CreateAction": "RunInstances", **tags}) in found
    assert {c.resource for c in found if c.action == "ec2:RunInstances"} >= {
        f"{ARN}subnet/subnet-1", f"{ARN}security-group/sg-default", f"{ARN}network-interface/*",
        "arn:aws:ec2:us-east-1::image/ami-1", f"{ARN}spot-instances-request/*"}
    assert Check("iam:PassRole", "arn:aws:iam::123456789012:role/jobplane-vm",
                 {"iam:PassedToService": "ec2.amazonaws.com"}) in found


def test_an_instance_action_is_checked_on_its_arn_with_its_tags_and_a_describe_on_everything() -> None:
    assert ec2("TerminateInstances", **{"InstanceId.1": "i-1"}) == [Check(
        "ec2:TerminateInstances", f"{ARN}instance/i-1",
        {"aws:ResourceTag/jobplane:managed": "true", "ec2:ResourceTag/jobplane:managed": "true"})]
    assert ec2("DescribeInstances") == [Check("ec2:DescribeInstances", "*")]


def test_parameters_topics_and_roles_are_checked_on_their_arns() -> None:
    public, own = "/aws/service/debian/x", "/jobplane/local/image"
    assert [c.resource for c in checks("ssm", "GetParameters", {"Names": [public, own]}, "r", "1")] == [
        "arn:aws:ssm:r::parameter/aws/service/debian/x", "arn:aws:ssm:r:1:parameter/jobplane/local/image"]
    assert checks("sns", "Publish", {"TopicArn": ["t"]}, "r", "1") == [Check("sns:Publish", "t")]
    assert checks("sts", "AssumeRole", {"RoleArn": ["role"]}, "r", "1") == [Check("sts:AssumeRole", "role")]


class Sts:
    """What FunctionSessions asks of the local AWS: a session of a role, counted."""

    def __init__(self) -> None:
        self.issued = 0

    def role_session(self, role: str, name: str, seconds: int) -> dict[str, str]:
        self.issued += 1
        return {"AccessKeyId": f"ASIA{self.issued}", "SecretAccessKey": "s", "SessionToken": "t"}


def test_each_function_runs_under_its_role_from_the_first_call_even_on_a_machine_just_booted() -> None:
    from jobplane.local.aws import FunctionSessions

    now = [12.0]  # time.monotonic() counts from the boot: a fresh CI machine's is small
    sts = Sts()
    sessions = FunctionSessions(sts, {"launcher": "arn:aws:iam::123456789012:role/jobplane-launcher"}, lambda: now[0])
    assert sessions.env("launcher")["AWS_ACCESS_KEY_ID"] == "ASIA1"  # never the process's own static keys
    assert sessions.env("launcher")["AWS_ACCESS_KEY_ID"] == "ASIA1" and sts.issued == 1  # kept ...
    now[0] += FunctionSessions.RENEW_S + 1
    assert sessions.env("launcher")["AWS_ACCESS_KEY_ID"] == "ASIA2"  # ... until renewed before it expires
