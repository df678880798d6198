"""The AWS credential vending function (functions/aws/vend.py) on the moto server, with STS sessions enforced as
on AWS (jobplane.local.moto_server): who it refuses, what it grants, and what the granted credentials reach.

The agent's end runs in its own process, as on a VM: no keys of this machine's, its instance role's session from
a local IMDS, the vending function behind a local function URL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from jobplane.clouds.aws_vend import proof
from jobplane.clouds.base import Scope
from jobplane.decide.vend import MAX_CODE_NAME, Refusal, code_object, scope
from jobplane.local.function_url import FunctionUrl, event
from jobplane.local.imds import FakeImds, ImdsInstance
from jobplane.model import keys
from jobplane.model.keys import LABEL_KEY
from jobplane.model.states import State
from jobplane.vending import aws_iam
from tests.helpers import LambdaContext
from tests.vending.conftest import BUCKET, REGION, Cloud  # the fixture `cloud` is there

pytestmark = pytest.mark.timeout(180)


def ask(body: dict[str, Any] | str) -> tuple[int, dict[str, Any]]:
    from functions.aws.vend import handler

    text = body if isinstance(body, str) else json.dumps(body)
    answer = handler(event("POST", "/", "", {"Content-Type": "application/json"}, text.encode(), "127.0.0.1",
                           "vend.lambda-url.us-east-1.on.aws"), LambdaContext())
    return int(answer["statusCode"]), json.loads(answer["body"])


def signed(creds: dict[str, Any], deployment: str = BUCKET) -> dict[str, Any]:
    return proof(Credentials(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"]), REGION,
                 deployment)


def request(cloud: Cloud, job: str, *, signer: str | None = None, attempt: int = 1, **extra: Any) -> dict[str, Any]:
    """What the agent of `signer`'s instance (default: the job's own) sends asking for `job`'s credentials."""
    creds = cloud.session(cloud.instances[signer or job])
    return {"job_id": job, "attempt": attempt, "proof": signed(creds), **extra}


# ---- refusals ----------------------------------------------------------------------------------------------
def test_an_instance_of_another_job_is_refused(cloud: Cloud) -> None:
    status, body = ask(request(cloud, "a", signer="b"))
    assert status == 403 and "is not an instance of job a attempt 1" in body["refused"]


@pytest.mark.parametrize(("state", "attempt", "why"), [
    (State.RUNNING, 2, "attempt 1 of job a is over"), (State.SUCCEEDED, 1, "job a is SUCCEEDED")])
def test_a_finished_attempt_is_refused(cloud: Cloud, state: State, attempt: int, why: str) -> None:
    cloud.put_record("a", state, attempt)
    status, body = ask(request(cloud, "a"))
    assert status == 403 and why in body["refused"], body


def test_a_caller_that_is_not_the_deployments_vm_role_is_refused(cloud: Cloud) -> None:
    other = cloud.aws.create_role("someone-else", aws_iam.trust({"Service": "ec2.amazonaws.com"}),
                                  aws_iam.document(aws_iam.vm_role_statements("arn:aws:lambda:::x", "aws", ())))
    creds = cloud.session(cloud.instances["a"], role=other)  # a session named like the instance, of another role
    status, body = ask({"job_id": "a", "attempt": 1, "proof": signed(creds)})
    assert status == 403 and "is not a session of this deployment's VM role" in body["refused"]
    job_session = cloud.session(cloud.instances["a"], role=cloud.job_role)
    assert ask({"job_id": "a", "attempt": 1, "proof": signed(job_session)})[0] == 403


def test_a_vm_role_session_of_no_instance_ec2_knows_is_refused(cloud: Cloud) -> None:
    creds = cloud.session("i-0123456789abcdef0")
    status, body = ask({"job_id": "a", "attempt": 1, "proof": signed(creds)})
    assert status == 403 and "is not an instance of this account and region" in body["refused"]


def test_a_forged_instance_id_in_the_body_is_refused(cloud: Cloud) -> None:
    status, body = ask(request(cloud, "b", signer="a", instance_id=cloud.instances["b"]))
    assert status == 403 and f"names instance {cloud.instances['b']} but was signed by" in body["refused"]


def test_a_proof_with_a_bad_signature_or_for_another_deployment_is_refused(cloud: Cloud) -> None:
    creds = cloud.session(cloud.instances["a"])
    forged = signed({**creds, "SecretAccessKey": "not-the-secret"})
    status, body = ask({"job_id": "a", "attempt": 1, "proof": forged})
    assert status == 403 and "SignatureDoesNotMatch" in body["refused"], body
    status, body = ask({"job_id": "a", "attempt": 1, "proof": signed(creds, deployment="another-registry")})
    assert status == 403 and "made for deployment 'another-registry'" in body["refused"]
    # the deployment header changed after signing: STS refuses the signature
    tampered = signed(creds, deployment="another-registry")
    tampered["headers"]["X-Jobplane-Deployment"] = BUCKET
    status, body = ask({"job_id": "a", "attempt": 1, "proof": tampered})
    assert status == 403 and "SignatureDoesNotMatch" in body["refused"], body
    # the body's URL is never used: a proof pointing elsewhere is still sent to the function's own STS
    elsewhere = {**signed(creds), "url": "http://127.0.0.1:9/"}
    assert ask({"job_id": "a", "attempt": 1, "proof": elsewhere})[0] == 200


@pytest.mark.parametrize(("body", "field"), [
    ("not json", "body"), ({"attempt": 1, "proof": {}}, "job_id"), ({"job_id": "a", "attempt": "1", "proof": {}},
                                                                    "attempt"),
    ({"job_id": "a", "attempt": 1}, "proof"), ({"job_id": "A/../b", "attempt": 1, "proof": {}}, "job_id")])
def test_bad_requests_name_the_field(cloud: Cloud, body: Any, field: str) -> None:
    status, answer = ask(body)
    assert status == 400 and answer["field"] == field


# ---- grants --------------------------------------------------------------------------------------------------
def test_the_jobs_own_instance_gets_credentials_that_reach_its_keys_only(cloud: Cloud) -> None:
    status, creds = ask(request(cloud, "a", instance_id=cloud.instances["a"]))
    assert status == 200 and set(creds) == {"AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration"}
    kw = {"aws_access_key_id": creds["AccessKeyId"], "aws_secret_access_key": creds["SecretAccessKey"],
          "aws_session_token": creds["SessionToken"], "region_name": REGION, "endpoint_url": cloud.endpoint}
    s3, sts = boto3.client("s3", **kw), boto3.client("sts", **kw)
    assert sts.get_caller_identity()["Arn"].endswith(":assumed-role/jobplane-job/a-a1")
    assert s3.get_object(Bucket=BUCKET, Key="jobs/a/job.json")["Body"].read()
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.get_object(Bucket=BUCKET, Key="jobs/b/job.json")


def test_the_session_policy_names_only_the_jobs_keys() -> None:
    scope = Scope("reg", ("team/jobs/a/", "team/heartbeats/a/"), ("team/preempted-jobs/a",),
                  ("team/system/agent/",), ("team/code/ml/a.tar.gz",))
    policy = aws_iam.session_policy(scope, "aws")
    resources = {r for st in policy["Statement"] for r in
                 (st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]])}
    assert resources == {  # never a data bucket: input data is read with the VM's own identity
        "arn:aws:s3:::reg/team/jobs/a/*", "arn:aws:s3:::reg/team/heartbeats/a/*",
        "arn:aws:s3:::reg/team/preempted-jobs/a",
        "arn:aws:s3:::reg/team/system/agent/*", "arn:aws:s3:::reg/team/code/ml/a.tar.gz", "arn:aws:s3:::reg"}
    writes = [st for st in policy["Statement"] if "s3:PutObject" in st["Action"]]
    assert [w["Resource"] for w in writes] == [["arn:aws:s3:::reg/team/jobs/a/*",
                                                "arn:aws:s3:::reg/team/heartbeats/a/*",
                                                "arn:aws:s3:::reg/team/preempted-jobs/a"]]
    (listing,) = [st for st in policy["Statement"] if st["Action"] == "s3:ListBucket"]
    assert listing["Resource"] == "arn:aws:s3:::reg"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [
        "team/jobs/a/*", "team/heartbeats/a/*", "team/system/agent/*"]}}  # prefixes: no object is listed
    assert len(aws_iam.packed(policy)) <= aws_iam.SESSION_POLICY_LIMIT
    with pytest.raises(ValueError, match="wildcard"):
        aws_iam.session_policy(Scope("reg", ("jobs/*/",), (), ()), "aws")


# ---- the session policy's size (AWS refuses one over 2,048 characters) ----------------------------------------
def test_a_session_policy_over_awss_limit_is_a_refusal_that_says_why(cloud: Cloud,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment the synth check would refuse (aws_iam.check_fits; here AWS's limit made small enough for any
    job): vend answered with an error the agent took for a transient one, forever; now a 403, final for the agent,
    that says why."""
    trial = "t" * 57 + "-t0001"  # a sweep trial's 63 characters
    cloud.instances[trial] = cloud.aws.run(managed=True, job_id=trial, attempt=1)
    cloud.put_record(trial)
    monkeypatch.setattr(aws_iam, "SESSION_POLICY_LIMIT", 600)
    status, body = ask(request(cloud, trial))
    assert status == 403, body
    assert body["refused"].startswith(f"job {trial}'s credentials cannot be granted: its session policy would be ")
    assert "over AWS's 600" in body["refused"] and "the deployment's bucket, root" in body["refused"]


def test_the_worst_case_is_the_longest_session_policy_an_accepted_job_gets() -> None:
    """What the synth check sizes is what vend builds for the longest id, owner and code name a spec may have."""
    longest, root = aws_iam.LONGEST_ID, "team-x"
    assert re.fullmatch(keys.JOB_ID_PATTERN, longest) and not re.fullmatch(keys.JOB_ID_PATTERN, longest + "o")
    assert re.fullmatch(LABEL_KEY, longest) and not re.fullmatch(LABEL_KEY, longest + "o")  # the owner's pattern
    bucket = "b" * aws_iam.MAX_BUCKET_NAME
    name = "c" * (MAX_CODE_NAME - len(".tar.gz")) + ".tar.gz"
    data = keys.JobData(longest, longest)
    code = code_object(f"s3://{bucket}/team-x/code/{longest}/{name}", bucket=bucket, root=root, owner=longest,
                       data=data)
    assert isinstance(code, str)
    policy = aws_iam.policy_document(scope(bucket, root, data, 10**6 - 1, code), aws_iam.LONGEST_PARTITION)
    assert len(aws_iam.packed(policy)) == aws_iam.worst_case_policy_size(None, root) <= 2048
    assert isinstance(code_object(f"s3://{bucket}/team-x/code/{longest}/c{name}", bucket=bucket, root=root,
                                  owner=longest, data=data), Refusal)  # a longer name is refused at launch


def test_a_deployment_whose_root_could_overflow_a_session_policy_is_refused() -> None:
    aws_iam.check_fits(None, "")  # S3's longest name for the registry
    aws_iam.check_fits("acme-jobplane", "platform/team-a/")
    with pytest.raises(ValueError, match=r"^the registry root '(r){80}/' makes a job's session policy up to 2\d{3} "
                                         r"characters, over AWS's 2048: give a shorter root$"):
        aws_iam.check_fits(None, "r" * 80 + "/")


# ---- the agent's end, in a VM's process ------------------------------------------------------------------------
AGENT = r"""
import json, sys
from botocore.exceptions import ClientError
from jobplane.clouds.aws_vend import vended_s3_client
from jobplane.clouds.base import LOG_OBJECT_TAG, AccessDenied, CredentialsRefused, NotFound
from jobplane.clouds.s3 import S3Store
region, url, job, bucket = sys.argv[1:5]
try:
    client = vended_s3_client(region, url, job, 1, bucket)
except CredentialsRefused as exc:
    print(json.dumps({"refused": str(exc)})); sys.exit()
store, out = S3Store(bucket, client), {}
def attempt(name, fn):
    try:
        fn(); out[name] = "ok"
    except NotFound:
        out[name] = "NotFound"
    except AccessDenied:
        out[name] = "AccessDenied"
    except ClientError as exc:
        out[name] = exc.response["Error"]["Code"]
for j in ("a", "b"):
    attempt(f"get {j} code", lambda: store.get(f"code/team/{j}.tar.gz"))
    attempt(f"get {j} bundle", lambda: store.get(f"teams/team/{j}/code/code.tar.gz"))
    attempt(f"get {j} job.json", lambda: store.get(f"jobs/{j}/job.json"))
    attempt(f"put {j} log", lambda: store.put(f"teams/team/{j}/logs/1/0/00000000.log", b"line"))
    attempt(f"put {j} heartbeat", lambda: store.put(f"heartbeats/{j}/1/0", b""))
    attempt(f"put {j} system metrics", lambda: store.put_if_absent(f"teams/team/{j}/system/1/0/00000000.jsonl",
                                                                 b"{}", tags=dict([LOG_OBJECT_TAG])))
    attempt(f"put {j} event file", lambda: store.put(f"teams/team/{j}/tensorboard/1/0/events.out.tfevents.1", b""))
    attempt(f"delete {j} checkpoint", lambda: store.delete(f"teams/team/{j}/checkpoints/step-1.pt"))
    attempt(f"put {j} exit report", lambda: store.put(f"jobs/{j}/attempts/1/nodes/0/exit.json", b"{}"))
    attempt(f"list {j}", lambda: list(store.list(f"teams/team/{j}/")))
    attempt(f"put {j} job.json", lambda: store.put(f"jobs/{j}/job.json", b"{}"))
    attempt(f"put {j} event", lambda: store.put(f"jobs/{j}/events/20260101T000000.000000Z-abcd-x.json", b"{}"))
attempt("get a missing", lambda: store.get("jobs/a/attempts/1/cluster.json"))
attempt("get data", lambda: S3Store("datasets", client).get("train/part-0"))
print(json.dumps(out))
"""


@pytest.fixture
def vend_url() -> Iterator[str]:
    from functions.aws.vend import handler

    url = FunctionUrl(lambda ev: handler(ev, LambdaContext()))
    url.start()
    try:
        yield url.url
    finally:
        url.stop()


def run_agent(cloud: Cloud, url: str, instance_job: str, job: str, imds_delay: float = 0.0) -> dict[str, str]:
    """The agent's calls from `instance_job`'s instance asking as `job`'s agent, in a VM's process; imds_delay: the
    seconds IMDS takes to answer the first ask for the instance's credentials."""
    delays = [imds_delay]

    def credentials() -> Any:
        if delays:
            time.sleep(delays.pop())
        return cloud.session(cloud.instances[instance_job])
    imds = FakeImds(ImdsInstance(cloud.instances[instance_job], role="jobplane-vm"), credentials=credentials).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_ACCESS", "AWS_SECRET", "AWS_SESSION",
                                                                         "AWS_EC2_METADATA_DISABLED"))}
        env.update(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.url, AWS_ENDPOINT_URL=cloud.endpoint, AWS_REGION=REGION)
        proc = subprocess.run([sys.executable, "-c", AGENT, REGION, url, job, BUCKET], capture_output=True, text=True,
                              env=env, timeout=120)
    finally:
        imds.stop()
    assert proc.returncode == 0, proc.stderr
    result: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_job_as_credentials_reach_its_keys_and_are_refused_on_job_bs(cloud: Cloud, vend_url: str) -> None:
    got = run_agent(cloud, vend_url, "a", "a")
    for action in ("get {} code", "get {} bundle", "get {} job.json", "put {} log", "put {} heartbeat",
                   "put {} system metrics", "put {} event file", "delete {} checkpoint", "put {} exit report",
                   "list {}"):
        assert got[action.format("a")] == "ok", (action, got)
        assert got[action.format("b")] == "AccessDenied", (action, got)
    for action in ("put {} job.json", "put {} event"):  # what the functions decide on: never a job's to write
        assert got[action.format("a")] == got[action.format("b")] == "AccessDenied", (action, got)
    assert got["get a missing"] == "NotFound"  # S3's 403 for a key the session may not list reads as missing
    assert got["get data"] == "AccessDenied"  # input data is the VM's own identity's to read, not these credentials'



def test_the_agent_of_another_jobs_instance_is_refused_for_good(cloud: Cloud, vend_url: str) -> None:
    got = run_agent(cloud, vend_url, "a", "b")
    assert "is not an instance of job b attempt 1" in got["refused"]


def test_an_imds_slower_than_botocores_one_second_still_gets_the_agent_its_credentials(cloud: Cloud,
                                                                                         vend_url: str) -> None:
    # botocore asks once with a 1 s timeout and reads no answer as "no credentials" (a VM on a loaded local cloud
    # lost its job to that); the agent waits longer
    got = run_agent(cloud, vend_url, "a", "a", imds_delay=1.5)
    assert got["get a code"] == "ok", got
