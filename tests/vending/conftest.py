"""The vending tests' cloud: the moto server with STS sessions enforced (jobplane.local.moto_server), the
deployment's roles, jobs a and b of owner `team` with an instance each (test_vend_aws.py, test_vend_secrets.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from jobplane.clouds.aws_local import LocalAws
from jobplane.local.aws import CREDENTIALS, create_roles
from jobplane.model.states import State
from tests.decide.helpers import record

REGION = "us-east-1"
BUCKET = "vend-registry"
DATA = "datasets"


@dataclass
class Cloud:
    aws: LocalAws
    endpoint: str
    vm_role: str
    job_role: str
    instances: dict[str, str]  # job -> its instance

    def session(self, instance_id: str, role: str | None = None) -> dict[str, Any]:
        return self.aws.role_session(role or self.vm_role, instance_id)

    def put_record(self, job: str, state: State = State.RUNNING, attempt: int = 1) -> None:
        rec = record(job, state, attempt, instances=[self.instances[job]], owner="team",
                     code=f"s3://{BUCKET}/code/team/{job}.tar.gz")
        self.aws.s3.put_object(Bucket=BUCKET, Key=f"jobs/{job}/job.json", Body=rec.model_dump_json().encode())


@pytest.fixture
def cloud(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    aws = LocalAws(REGION, moto_endpoint, CREDENTIALS)
    aws.create_bucket(BUCKET)
    aws.create_bucket(DATA)
    roles = create_roles(aws, BUCKET)
    for name, value in {"JOBPLANE_BUCKET": BUCKET, "AWS_REGION": REGION, "JOBPLANE_ROOT": "", **roles.env()}.items():
        monkeypatch.setenv(name, value)
    found = Cloud(aws, moto_endpoint, roles.vm, roles.job, {})
    for job in ("a", "b"):
        found.instances[job] = aws.run(managed=True, job_id=job, attempt=1)
        found.put_record(job)
        for key in (f"teams/team/{job}/code/code.tar.gz", f"code/team/{job}.tar.gz",
                    f"teams/team/{job}/checkpoints/step-1.pt"):
            aws.s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    aws.s3.put_object(Bucket=DATA, Key="train/part-0", Body=b"data")
    return found


