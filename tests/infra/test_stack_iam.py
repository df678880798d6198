"""The local AWS cloud runs each function under its role as the session's synth defines it: the export it reads
(jobplane.local.stack_iam, cached by a digest of its inputs) holds exactly the template's statements, and resolved to
the local cloud's resources they grant what the template grants there."""

from __future__ import annotations

import pytest

from infra.aws import iam_export
from jobplane.local import iam_policy, stack_iam
from tests.infra.conftest import Synth

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]
LOCAL = stack_iam.Local("jobplane-local", "us-east-1", "123456789012",
                        {"VmRole": "arn:aws:iam::123456789012:role/jobplane-vm",
                         "JobRole": "arn:aws:iam::123456789012:role/jobplane-job"},
                        "arn:aws:sns:us-east-1:123456789012:jobplane-jobs", ["subnet-a", "subnet-b", "subnet-c"],
                        "sg-default")


def test_the_local_clouds_export_is_the_templates_function_roles(synth: Synth) -> None:
    exported = stack_iam.load()
    assert set(exported["functions"]) == set(stack_iam.FUNCTIONS)
    assert exported["functions"] == iam_export.export(synth.template)["functions"]


def test_resolved_roles_grant_the_launch_on_the_local_network_and_nothing_of_another_deployment() -> None:
    launcher = stack_iam.documents(stack_iam.load(), LOCAL)["launcher"]
    ours = {"aws:RequestTag/jobplane:managed": "true", "aws:RequestTag/jobplane:deployment": "jobplane-local"}
    arn = "arn:aws:ec2:us-east-1:123456789012:"
    assert iam_policy.evaluate(launcher, "ec2:RunInstances", f"{arn}instance/*", ours) == iam_policy.ALLOW
    assert iam_policy.evaluate(launcher, "ec2:RunInstances", f"{arn}subnet/subnet-c") == iam_policy.ALLOW
    assert iam_policy.evaluate(launcher, "ec2:RunInstances", f"{arn}subnet/subnet-z") is None
    theirs = {**ours, "aws:RequestTag/jobplane:deployment": "other-bucket"}
    assert iam_policy.evaluate(launcher, "ec2:RunInstances", f"{arn}instance/*", theirs) is None
    assert iam_policy.evaluate(launcher, "iam:PassRole", LOCAL.roles["VmRole"],
                               {"iam:PassedToService": "ec2.amazonaws.com"}) == iam_policy.ALLOW
    assert iam_policy.evaluate(launcher, "sns:Publish", str(LOCAL.topic)) == iam_policy.ALLOW
    vend = stack_iam.documents(stack_iam.load(), LOCAL)["vend"]
    assert iam_policy.evaluate(vend, "sts:AssumeRole", LOCAL.roles["JobRole"]) == iam_policy.ALLOW
    assert iam_policy.evaluate(vend, "s3:PutObject", "arn:aws:s3:::jobplane-local/jobs/j/job.json") is None
