"""A job's `code:` reaches its own bundle, never the rest of the registry (issue 37, G1): decide.vend's rule, then
what the credentials it grants reach on each cloud, evaluated as the local clouds evaluate them: the AWS session
policy over the job role by the local cloud's IAM (jobplane.local.iam_policy, what its moto enforces), the GCS
boundary by the GCS fake's STS (jobplane.local.fake_sts). Pure: no server, no cloud."""

from __future__ import annotations

import pytest

from jobplane.clouds.base import TAG_ATTEMPT, TAG_DEPLOYMENT, TAG_JOB_ID, TAG_MANAGED
from jobplane.clouds.gcs_downscope import boundary
from jobplane.decide.vend import MAX_CODE_NAME, Caller, Grant, Refusal, code_object, decide
from jobplane.local import fake_sts, iam_policy
from jobplane.model.keys import JobData
from jobplane.vending import aws_iam
from tests.decide.helpers import record

BUCKET = "reg"
OWNER = "team-a"
# What another team's job, and the control plane, keep in the registry: no key of them is team A's job's to read.
OTHERS = ("code/team-b/b.tar.gz", "teams/team-b/b/code/code.tar.gz", "teams/team-a/b/code/code.tar.gz",
          "jobs/b/code/code.tar.gz", "jobs/b/job.json", "config/policy.yaml", "queue/team-b/b.yaml")
# `code:` keys a hostile spec of team A's job `a` may name, in the registry's bucket.
HOSTILE = ("code/", "", "code/team-b/", "code/team-b/b.tar.gz", "jobs/b/code/code.tar.gz", "jobs/b/code/",
           "teams/team-b/b/code/code.tar.gz", "teams/team-a/b/code/", "teams/team-a/", "jobs/a/code/code.tar.gz",
           "code/team-a/../team-b/b.tar.gz", "other-root/code/team-a/a.tar.gz", "code/team-a/")
TAGS = {TAG_MANAGED: "true", TAG_DEPLOYMENT: BUCKET, TAG_JOB_ID: "a", TAG_ATTEMPT: "1"}


def data(job_id: str | None) -> JobData | None:
    """Where team A's job keeps its data (None: a sweep's spec, which has no keys of its own)."""
    return JobData(job_id, OWNER) if job_id else None


def verdict(scheme: str, key: str) -> Grant | Refusal:
    """decide.vend's answer to job a's own VM, the job's spec naming `code: <scheme>://reg/<key>`."""
    rec = record("a", owner=OWNER, code=f"{scheme}://{BUCKET}/{key}")
    return decide(rec, Caller("i-a-1-0", "a", 1, tags=TAGS), bucket=BUCKET, root="", deployment=BUCKET)


# ---- the rule --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("code", "job_id", "granted"), [
    (None, "a", None),  # the agent reads teams/team-a/a/code/code.tar.gz, in its own keys
    ("s3://datasets/code/train.tar.gz", "a", None),  # another bucket: the VM's own identity reads it
    ("s3://reg/teams/team-a/a/code/code.tar.gz", "a", None),  # its own keys: its credentials reach them already
    ("s3://reg/teams/team-a/a/code/src/", "a", None),
    ("s3://reg/code/team-a/a.tar.gz", "a", "code/team-a/a.tar.gz"),  # where `submit --code` uploads
    ("s3://reg/code/team-a/sweep-1.tar.gz", "sweep-1-t0003", "code/team-a/sweep-1.tar.gz"),  # a trial's, its sweep's
    ("s3://reg/code/team-a/project/v2.tgz", "a", "code/team-a/project/v2.tgz"),
    ("s3://reg/code/team-a/s.tar.gz", None, "code/team-a/s.tar.gz"),  # a sweep's spec
])
def test_a_jobs_code_is_its_own_bundle_as_one_object(code: str | None, job_id: str | None, granted: str) -> None:
    assert code_object(code, bucket=BUCKET, root="", owner=OWNER, data=data(job_id)) == granted


def test_the_rule_follows_the_registry_root() -> None:
    assert code_object("gs://reg/team-x/code/team-a/a.tar.gz", bucket=BUCKET, root="team-x", owner=OWNER,
                       data=data("a")) == "team-x/code/team-a/a.tar.gz"
    assert code_object("gs://reg/team-x/teams/team-a/a/code/code.tar.gz", bucket=BUCKET, root="team-x/", owner=OWNER,
                       data=data("a")) is None
    assert code_object("gs://reg/team-x/jobs/a/code/code.tar.gz", bucket=BUCKET, root="team-x/", owner=OWNER,
                       data=JobData("a")) is None  # a job recorded before its data moved under teams/
    assert isinstance(code_object("gs://reg/code/team-a/a.tar.gz", bucket=BUCKET, root="team-x", owner=OWNER,
                                  data=data("a")), Refusal)  # another root's, maybe another deployment's


@pytest.mark.parametrize(("key", "job_id", "why"), [
    *((key, "a", "is not this job's own code" if not key.startswith("code/team-a/") else "one tarball")
      for key in HOSTILE),
    ("code/team-a/train", "a", "one tarball"),  # a folder to list: never granted
    ("code/team-a/a.tar.gz?x", "a", "one tarball"),
    ("jobs/s/code/code.tar.gz", None, "a sweep's trials each have their own keys"),
    ("code/team-a/" + "x" * (MAX_CODE_NAME - 6) + ".tar.gz", "a", f"over {MAX_CODE_NAME}"),
])
def test_any_other_registry_key_is_refused_saying_where_code_goes(key: str, job_id: str | None, why: str) -> None:
    refused = code_object(f"s3://reg/{key}", bucket=BUCKET, root="", owner=OWNER, data=data(job_id))
    assert isinstance(refused, Refusal) and why in refused.why, refused
    assert ("code/team-a/<name>.tar.gz" in refused.why or f"over {MAX_CODE_NAME}" in refused.why)


def test_a_record_accepted_before_the_check_gets_no_credentials_naming_its_code() -> None:
    refused = verdict("s3", "code/")
    assert isinstance(refused, Refusal) and refused.why.startswith("job a's code: s3://reg/code/ is in the registry")


# ---- AWS: the session policy over the job role, as the local cloud's IAM evaluates it --------------------------
JOB_ROLE = aws_iam.document(aws_iam.job_role_statements(aws_iam.bucket_arn("aws", BUCKET), ""))


def aws_reaches(key: str, grant: Grant | Refusal) -> list[str]:
    """What of OTHERS, and of the bucket's listing, the credentials granted reach (nothing when refused)."""
    if not isinstance(grant, Grant):
        return []
    session = aws_iam.session_policy(grant.scope, "aws")
    reads = [k for k in OTHERS
             if iam_policy.session_allows([JOB_ROLE], session, "s3:GetObject", f"arn:aws:s3:::{BUCKET}/{k}")]
    lists = [p for p in ("", "code/", "code/team-b/", "jobs/b/")
             if iam_policy.session_allows([JOB_ROLE], session, "s3:ListBucket", f"arn:aws:s3:::{BUCKET}",
                                          {"s3:prefix": p})]
    return reads + [f"list {p!r}" for p in lists]


@pytest.mark.parametrize("key", HOSTILE)
def test_aws_a_hostile_code_key_reaches_no_other_teams_keys(key: str) -> None:
    granted = verdict("s3", key)
    assert aws_reaches(key, granted) == []
    assert isinstance(granted, Refusal) and "code" in granted.why


def test_aws_the_own_bundle_is_read_as_exactly_that_object() -> None:
    granted = verdict("s3", "code/team-a/a.tar.gz")
    assert isinstance(granted, Grant)
    session = aws_iam.session_policy(granted.scope, "aws")

    def reads(key: str) -> bool:
        return iam_policy.session_allows([JOB_ROLE], session, "s3:GetObject", f"arn:aws:s3:::{BUCKET}/{key}")

    assert reads("code/team-a/a.tar.gz") and reads("teams/team-a/a/code/code.tar.gz")
    assert not any(map(reads, ("code/team-a/a.tar.gz.old", "code/team-a/other.tar.gz", *OTHERS)))
    assert not iam_policy.session_allows([JOB_ROLE], session, "s3:ListBucket", f"arn:aws:s3:::{BUCKET}",
                                         {"s3:prefix": "code/team-a/"})


# ---- GCP: the Credential Access Boundary, as the GCS fake's STS evaluates it -------------------------------------
def gcs_reaches(grant: Grant | Refusal) -> list[str]:
    if not isinstance(grant, Grant):
        return []
    rules = tuple(fake_sts.parse_rule(r) for r in boundary(grant.scope)["accessBoundary"]["accessBoundaryRules"])
    reads = [k for k in OTHERS if fake_sts.allowed(rules, "get", BUCKET, k)]
    lists = [p for p in ("", "code/", "code/team-b/", "jobs/b/") if fake_sts.allowed(rules, "list", BUCKET, None, p)]
    return reads + [f"list {p!r}" for p in lists]


@pytest.mark.parametrize("key", HOSTILE)
def test_gcp_a_hostile_code_key_reaches_no_other_teams_keys(key: str) -> None:
    granted = verdict("gs", key)
    assert gcs_reaches(granted) == []
    assert isinstance(granted, Refusal) and "code" in granted.why


def test_gcp_the_own_bundle_is_read_as_exactly_that_object() -> None:
    granted = verdict("gs", "code/team-a/a.tar.gz")
    assert isinstance(granted, Grant)
    rules = tuple(fake_sts.parse_rule(r) for r in boundary(granted.scope)["accessBoundary"]["accessBoundaryRules"])
    assert fake_sts.allowed(rules, "get", BUCKET, "code/team-a/a.tar.gz")
    assert fake_sts.allowed(rules, "get", BUCKET, "teams/team-a/a/code/code.tar.gz")
    for key in ("code/team-a/a.tar.gz.old", "code/team-a/a.tar.gz/x", "code/team-a/other.tar.gz", *OTHERS):
        assert not fake_sts.allowed(rules, "get", BUCKET, key), key
    assert not fake_sts.allowed(rules, "list", BUCKET, None, "code/team-a/")
