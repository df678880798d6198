"""`jobplane secret set|ls|rm` and submit's check of `secrets:` on in-process moto (SSM Parameter Store and S3), and
what a team member's policy lets it do with secrets, as IAM evaluates it (jobplane.local.iam_policy, the evaluator
the local cloud's moto enforces)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner
from moto import mock_aws

from jobplane.cli import cli
from jobplane.clouds.aws_secrets import SsmSecrets
from jobplane.local.iam_policy import ALLOW, evaluate
from jobplane.model.secrets import MAX_VALUE, deployment_tag
from jobplane.vending import aws_iam

BUCKET, REGION = "secrets-registry", "us-east-1"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[SsmSecrets]:
    monkeypatch.setenv("JOBPLANE_BUCKET", BUCKET)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.delenv("JOBPLANE_OWNER", raising=False)
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield SsmSecrets(boto3.client("ssm", region_name=REGION), BUCKET)


def run(*args: str, stdin: bytes | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), input=stdin)
    return result.exit_code, result.output


def test_set_ls_rm_never_show_a_value_and_submit_refuses_an_unknown_name(registry: SsmSecrets,
                                                                          tmp_path: Path) -> None:
    code, out = run("secret", "set", "hf-token", "--owner", "team-s", stdin=b"hf_s3cret\n")
    assert code == 0 and "hf_s3cret" not in out
    assert registry.get("team-s", "hf-token") == b"hf_s3cret"  # one trailing newline dropped
    big = tmp_path / "big"
    big.write_bytes(b"k" * MAX_VALUE)
    assert run("secret", "set", "big", "--owner", "team-s", "--from-file", str(big))[0] == 0
    big.write_bytes(b"k" * (MAX_VALUE + 1))
    code, out = run("secret", "set", "big", "--owner", "team-s", "--from-file", str(big))
    assert code != 0 and "value" in out and "64 KiB" in out
    code, out = run("secret", "set", "Bad_Name", "--owner", "team-s", stdin=b"x")
    assert code != 0 and "name" in out
    code, out = run("secret", "ls", "--json")
    assert code == 0 and [(s["owner"], s["name"]) for s in json.loads(out)] == [("team-s", "big"),
                                                                                 ("team-s", "hf-token")]
    assert "hf_s3cret" not in run("secret", "ls")[1]

    spec = tmp_path / "job.yaml"
    spec.write_text("instance_type: t3.micro\nrun: echo hi\nsecrets: {HF_TOKEN: hf-token, WANDB_API_KEY: wandb}\n")
    code, out = run("submit", str(spec), "--owner", "team-s")
    assert code != 0 and "secrets.WANDB_API_KEY" in out and "no secret 'wandb' of owner 'team-s'" in out
    assert "HF_TOKEN" not in out
    spec.write_text("instance_type: t3.micro\nrun: echo hi\nsecrets: {HF_TOKEN: hf-token}\n")
    code, out = run("submit", str(spec), "--owner", "team-t")  # another team naming team-s's secret
    assert code != 0 and "secrets.HF_TOKEN" in out and "owner 'team-t'" in out

    assert run("secret", "rm", "hf-token", "--owner", "team-s")[0] == 0
    code, out = run("secret", "rm", "hf-token", "--owner", "team-s")
    assert code != 0 and "no secret hf-token" in out
    assert [s.name for s in registry.list("team-s")] == ["big"]


def test_a_team_member_writes_only_its_own_teams_secrets_and_reads_no_value() -> None:
    member = [aws_iam.document(aws_iam.submitter_statements(aws_iam.bucket_arn("aws", BUCKET), ""))]
    context = {"aws:PrincipalTag/jobplane-owner": "team-s"}
    tag = deployment_tag(BUCKET)

    def allowed(action: str, owner: str, rest: str) -> bool:
        arn = f"arn:aws:ssm:{REGION}:123456789012:parameter/jobplane/{tag}/{owner}/hf-token/{rest}"
        return evaluate(member, action, arn, context) == ALLOW
    assert allowed("ssm:PutParameter", "team-s", "a1b2c3d4/0") and allowed("ssm:DeleteParameter", "team-s", "head")
    assert allowed("ssm:GetParameter", "team-s", "head")  # which pieces are current: no value
    assert not allowed("ssm:GetParameter", "team-s", "a1b2c3d4/0")  # a piece of the value: only its jobs read it
    assert not allowed("ssm:PutParameter", "team-t", "head") and not allowed("ssm:GetParameter", "team-t", "head")
    assert evaluate(member, "ssm:DescribeParameters", "*", context) == ALLOW  # names only
