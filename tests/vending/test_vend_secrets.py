"""Secrets on the moto server, with STS sessions enforced as on AWS (jobplane.local.moto_server): a job's vended
credentials read exactly the secrets of its owner its spec names (SSM SecureStrings in pieces,
clouds/aws_secrets.py); another secret, another owner's, and a job that is over get nothing."""

from __future__ import annotations

import os
from typing import Any

import boto3
import pytest

from jobplane.clouds.aws_secrets import SsmSecrets
from jobplane.clouds.base import AccessDenied
from jobplane.model.secrets import MAX_VALUE, SecretMissing
from jobplane.model.states import State
from tests.decide.helpers import record
from tests.vending.conftest import BUCKET, REGION, Cloud
from tests.vending.test_vend_aws import ask, request

pytestmark = pytest.mark.timeout(180)


def put_record(cloud: Cloud, job: str, owner: str, secrets: dict[str, Any], state: State = State.RUNNING,
               attempt: int = 1) -> None:
    rec = record(job, state, attempt, instances=[cloud.instances[job]], owner=owner, secrets=secrets)
    cloud.aws.s3.put_object(Bucket=BUCKET, Key=f"jobs/{job}/job.json", Body=rec.model_dump_json().encode())


def platform(cloud: Cloud) -> SsmSecrets:
    return SsmSecrets(cloud.aws.ssm, BUCKET)


def job_secrets(cloud: Cloud, job: str) -> SsmSecrets:
    status, creds = ask(request(cloud, job))
    assert status == 200, creds
    return SsmSecrets(boto3.client("ssm", aws_access_key_id=creds["AccessKeyId"],
                                   aws_secret_access_key=creds["SecretAccessKey"],
                                   aws_session_token=creds["SessionToken"], region_name=REGION,
                                   endpoint_url=cloud.endpoint), BUCKET)


def test_a_jobs_credentials_read_only_the_secrets_its_spec_names_while_it_is_live(cloud: Cloud) -> None:
    store = platform(cloud)
    big, other = os.urandom(MAX_VALUE), os.urandom(32)
    store.put("team", "hf-token", big)  # 64 KiB: 22 pieces of 4,000 characters
    store.put("team", "other", other)
    put_record(cloud, "a", "team", {"HF_TOKEN": {"name": "hf-token", "file": True}})
    put_record(cloud, "b", "team-t", {"HF_TOKEN": "hf-token"})  # another owner naming the same secret

    mine = job_secrets(cloud, "a")
    assert mine.get("team", "hf-token") == big
    with pytest.raises(AccessDenied):  # the owner's, but not named by the spec
        mine.get("team", "other")

    theirs = job_secrets(cloud, "b")  # its grant names team-t's hf-token, which does not exist
    with pytest.raises(AccessDenied):
        theirs.get("team", "hf-token")
    with pytest.raises(SecretMissing):
        theirs.get("team-t", "hf-token")

    store.put("team", "hf-token", b"rotated-value")  # the platform team rotates it: the next attempt reads it
    cloud.aws.ec2.create_tags(Resources=[cloud.instances["a"]], Tags=[{"Key": "jobplane:attempt", "Value": "2"}])
    put_record(cloud, "a", "team", {"HF_TOKEN": "hf-token"}, attempt=2)
    status, _ = ask(request(cloud, "a", attempt=1))
    assert status == 403  # the old attempt's VMs get nothing more
    status, creds = ask(request(cloud, "a", attempt=2))
    assert status == 200
    assert SsmSecrets(boto3.client("ssm", aws_access_key_id=creds["AccessKeyId"],
                                   aws_secret_access_key=creds["SecretAccessKey"],
                                   aws_session_token=creds["SessionToken"], region_name=REGION,
                                   endpoint_url=cloud.endpoint), BUCKET).get("team", "hf-token") == b"rotated-value"

    put_record(cloud, "a", "team", {"HF_TOKEN": "hf-token"}, state=State.SUCCEEDED, attempt=2)
    status, body = ask(request(cloud, "a", attempt=2))
    assert status == 403 and "SUCCEEDED" in body["refused"]  # a finished job's VMs get no credentials at all
