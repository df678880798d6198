"""Owners that hold: a job's owner is the queue/<owner>/ folder its drop was written to (queue/ itself: owner
default), a spec claiming another owner is refused naming `owner`, quotas count by that owner, and the CLI
submits, finds, lists and cancels jobs in owners' folders. moto S3 + EC2 in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from jobplane.cli import cli
from jobplane.control import launcher
from jobplane.decide.rules import LaunchCause
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from jobplane.ops import jobs
from tests.moto_aws import BUCKET, MotoAws

pytestmark = pytest.mark.timeout(120)

SPEC = "instance_type: t3.micro\nrun: python3 train.py\n"


def handle(moto_aws: MotoAws, key: str) -> launcher.Result:
    return launcher.handle_drop(moto_aws.context(), key, now=utcnow()).result


def rejection(moto_aws: MotoAws, job_id: str) -> list[dict[str, str]]:
    return list(moto_aws.registry.get_json(keys.rejected_error(job_id))["errors"])


def test_the_drops_folder_is_the_owner_on_the_record_and_the_instances(moto_aws: MotoAws) -> None:
    assert handle(moto_aws, moto_aws.drop("vision-1", SPEC, owner="team-a")) == "launched"
    assert handle(moto_aws, moto_aws.drop("says-so", SPEC + "owner: team-a\n", owner="team-a")) == "launched"
    assert handle(moto_aws, moto_aws.drop("plain", SPEC)) == "launched"
    reg = moto_aws.registry
    assert [reg.job(j).owner for j in ("vision-1", "says-so", "plain")] == ["team-a", "team-a", "default"]
    tags = {t["Value"] for i in moto_aws.instances() for t in i["Tags"] if t["Key"] == "jobplane:owner"}
    assert tags == {"team-a", "default"}
    assert [k for k, _, _ in reg.listing(keys.QUEUE)] == []


@pytest.mark.parametrize(("key", "text"), [
    ("queue/team-b/spoof.yaml", SPEC + "owner: team-a\n"),  # another team's name in the spec
    ("queue/spoof.yaml", SPEC + "owner: team-a\n"),  # a plain drop is owner default's
])
def test_a_spec_claiming_another_owner_is_refused_naming_owner(moto_aws: MotoAws, key: str, text: str) -> None:
    moto_aws.s3.put_object(Bucket=BUCKET, Key=key, Body=text.encode())
    assert handle(moto_aws, key) == "rejected"
    (error,) = rejection(moto_aws, "spoof")
    assert error["field"] == "owner" and "'team-a' is not the owner of this drop" in error["message"]
    assert moto_aws.registry.get_bytes(keys.rejected_spec("spoof")) == text.encode()  # kept as dropped
    assert not moto_aws.registry.exists("spoof") and moto_aws.calls.run_instances == []
    assert [k for k, _, _ in moto_aws.registry.listing(keys.QUEUE)] == []


@pytest.mark.parametrize("key", ["queue/Team A/odd.yaml", "queue/team-a/nested/odd.yaml"])
def test_a_folder_that_is_not_an_owner_name_is_refused(moto_aws: MotoAws, key: str) -> None:
    moto_aws.s3.put_object(Bucket=BUCKET, Key=key, Body=SPEC.encode())
    assert handle(moto_aws, key) == "rejected"
    assert [e["field"] for e in rejection(moto_aws, "odd")] == ["owner"]


def test_quotas_count_by_the_drops_owner_whatever_the_spec_leaves_out(moto_aws: MotoAws) -> None:
    moto_aws.set_policy(f"max_active_instances_per_owner: 1\naws:\n  default_image: {moto_aws.image}\n")
    assert handle(moto_aws, moto_aws.drop("a-1", SPEC, owner="team-a")) == "launched"
    assert handle(moto_aws, moto_aws.drop("a-2", SPEC, owner="team-a")) == "waiting"
    waiting = moto_aws.registry.job("a-2")
    assert waiting.cause == LaunchCause.OVER_QUOTA and waiting.reason == (
        "owner 'team-a' has 1 active instances; 1 more would exceed the quota of 1 (max_active_instances_per_owner)")
    assert handle(moto_aws, moto_aws.drop("b-1", SPEC, owner="team-b")) == "launched"
    assert handle(moto_aws, moto_aws.drop("d-1", SPEC)) == "launched"  # owner default has its own quota


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_submit_as_an_owner_writes_its_folders_and_the_job_is_found_listed_and_cancelled(
        moto_aws: MotoAws, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    submitted = run("submit", str(spec), "--code", str(tmp_path / "src"), "--owner", "team-a", "--id", "mine")
    assert submitted.exit_code == 0, submitted.output
    reg = moto_aws.registry
    assert [k for k, _, _ in reg.listing(keys.QUEUE)] == ["queue/team-a/mine.yaml"]
    dropped = reg.get_bytes("queue/team-a/mine.yaml").decode()
    assert "owner: team-a" in dropped and f"s3://{BUCKET}/code/team-a/mine.tar.gz" in dropped
    assert [k for k, _, _ in reg.listing(keys.CODE)] == ["code/team-a/mine.tar.gz"]

    described = json.loads(run("describe", "mine", "--json").stdout)
    assert described["job"]["state"] == "QUEUED" and described["job"]["drop"] == "queue/team-a/mine.yaml"
    assert described["job"]["spec"]["owner"] == "team-a"
    assert [r["id"] for r in json.loads(run("ls", "--json").stdout)] == ["mine"]
    assert run("submit", str(spec), "--owner", "team-a", "--id", "mine").exit_code == 1  # already queued

    cancelled = run("cancel", "mine")
    assert cancelled.exit_code == 0, cancelled.output
    assert reg.job("mine").state == State.CANCELLED and reg.job("mine").owner == "team-a"
    assert [k for k, _, _ in reg.listing(keys.QUEUE)] == []


def test_submit_refuses_two_owners_and_follows_the_specs_own(moto_aws: MotoAws, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "owner: team-b\n")
    clash = run("submit", str(spec), "--owner", "team-a")
    assert clash.exit_code == 1 and "--owner 'team-a' differs from the spec's owner 'team-b'" in clash.output
    assert run("submit", str(spec), "--id", "theirs").exit_code == 0
    assert [k for k, _, _ in moto_aws.registry.listing(keys.QUEUE)] == ["queue/team-b/theirs.yaml"]
    assert jobs.find(moto_aws.registry, "theirs").spec.owner == "team-b"  # type: ignore[union-attr]
    plain = tmp_path / "plain.yaml"
    plain.write_text(SPEC)
    bad = run("submit", str(plain), "--owner", "Team B")
    assert bad.exit_code == 1 and "owner: 'Team B' is not a valid owner" in bad.output, bad.output


def test_a_label_posing_as_an_owner_is_refused_and_never_fills_that_owners_quota(moto_aws: MotoAws) -> None:
    moto_aws.set_policy(f"max_active_instances_per_owner: 1\naws:\n  default_image: {moto_aws.image}\n")
    assert handle(moto_aws, moto_aws.drop("posing", SPEC + "labels:\n  jobplane-owner: bob\n")) == "rejected"
    assert [e["field"] for e in rejection(moto_aws, "posing")] == ["labels.jobplane-owner"]
    # a VM carrying the GCE-style label on EC2 (launched before labels were checked) is not bob's
    moto_aws.ec2.run_instances(ImageId=moto_aws.image, MinCount=1, MaxCount=1, TagSpecifications=[{
        "ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in {
            "jobplane:managed": "true", "jobplane:deployment": BUCKET, "jobplane:job-id": "old",
            "jobplane:owner": "alice", "jobplane-owner": "bob"}.items()]}])
    assert handle(moto_aws, moto_aws.drop("bobs", SPEC, owner="bob")) == "launched", "bob has no VM yet"


CODES = [  # (a spec's code:, what becomes of team-a's job), in one registry
    (f"s3://{BUCKET}/code/", "invalid"),  # every team's bundles
    (f"s3://{BUCKET}/", "invalid"),  # the whole registry
    (f"s3://{BUCKET}/code/team-b/theirs.tar.gz", "invalid"),
    (f"s3://{BUCKET}/jobs/theirs/code/code.tar.gz", "invalid"),
    (f"s3://{BUCKET}/code/team-a/{'x' * 200}.tar.gz", "invalid"),  # its credentials' policy would not fit AWS's
    (f"s3://{BUCKET}/code/team-a/mine-5.tar.gz", "launched"),  # where submit --code uploads it
    (f"s3://{BUCKET}/code/team-a/shared/v2.tar.gz", "launched"),
    (f"s3://{BUCKET}/teams/team-a/mine-7/code/code.tar.gz", "launched"),  # job mine-7's own keys (it is CODES[7])
    ("s3://datasets/code/mine.tar.gz", "launched"),  # another bucket: the VM's own identity reads it, or cannot
    (f"s3://{BUCKET}/jobs/mine-9/code/code.tar.gz", "invalid"),  # its record's folder: no longer where its data is
    (f"s3://{BUCKET}/teams/team-b/mine-10/code/code.tar.gz", "invalid"),  # another team's folder, its own id
]


def test_a_code_key_in_the_registry_must_be_the_jobs_own_or_the_job_is_invalid_naming_code(moto_aws: MotoAws) -> None:
    for n, (code, result) in enumerate(CODES):
        job = f"mine-{n}"
        assert handle(moto_aws, moto_aws.drop(job, SPEC + f"code: {code}\n", owner="team-a")) == result, code
        record = moto_aws.registry.job(job)
        if result == "invalid":
            assert record.state == State.INVALID and (record.reason or "").startswith(f"code: {code}")
            (error,) = rejection(moto_aws, job)
            assert error["field"] == "code" and "code/team-a/" in error["message"]  # says where its code goes
            assert moto_aws.registry.get_bytes(keys.rejected_spec(job))
        else:
            assert record.state == State.LAUNCHING and record.spec.code == code
    assert len(moto_aws.calls.run_instances) == [r for _, r in CODES].count("launched")


def test_a_sweeps_code_in_the_registry_is_its_owners_bundle_which_every_trial_reads(moto_aws: MotoAws) -> None:
    sweep = ("sweep:\n  parameters:\n    lr: {loguniform: [0.0001, 0.1]}\n  max_trials: 2\n  max_parallel: 1\n"
             "  objective: {metric: loss, goal: minimize}\n")
    inside = SPEC + sweep + f"code: s3://{BUCKET}/jobs/sw/code/code.tar.gz\n"  # no trial's own keys
    assert handle(moto_aws, moto_aws.drop("sw", inside, owner="team-a")) == "invalid"
    (error,) = rejection(moto_aws, "sw")
    assert error["field"] == "code" and "a sweep's trials each have their own keys" in error["message"]
    bundle = SPEC + sweep + f"code: s3://{BUCKET}/code/team-a/sw2.tar.gz\n"
    assert handle(moto_aws, moto_aws.drop("sw2", bundle, owner="team-a")) == "sweep"
    (trial,) = [k for k, _, _ in moto_aws.registry.listing(keys.QUEUE)]
    assert handle(moto_aws, trial) == "launched"
