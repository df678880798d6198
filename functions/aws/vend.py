"""Vend Lambda, behind a function URL with AuthType AWS_IAM: a job's agent asks for its job's storage credentials
(jobplane.vending.aws does the work; jobplane.clouds.aws_vend talks to STS and EC2).

Its environment, besides the registry's: JOBPLANE_VM_ROLE_ARN (whose sessions may ask) and JOBPLANE_JOB_ROLE_ARN
(what a grant assumes). A job's input data is read with its VM's own identity, never with these credentials.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.aws import common
from jobplane.clouds.aws_vend import VendAws
from jobplane.clouds.s3 import S3Store
from jobplane.settings import Settings
from jobplane.store.rooted import RootedStore
from jobplane.vending.aws import VendSettings, vend

# reused across invocations, like the clients (per region, deployment, endpoint and access key)
_cloud: dict[tuple[str | None, str, str | None, str | None], VendAws] = {}


def settings() -> tuple[Settings, VendSettings]:
    base = Settings.from_env()
    return base, VendSettings(base.bucket, base.root, base.deployment, os.environ["JOBPLANE_VM_ROLE_ARN"],
                              os.environ["JOBPLANE_JOB_ROLE_ARN"])


@common.logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    base, vending = settings()
    where = (base.region, base.deployment, os.environ.get("AWS_ENDPOINT_URL"), common.access_key())
    if where not in _cloud:
        _cloud[where] = VendAws(base.region or "us-east-1", base.deployment)
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        body = base64.b64decode(body)
    registry = RootedStore(S3Store(base.bucket, common.client("s3", base)), base.root)
    answer = vend(body, vending, _cloud[where], registry, common.logger)
    return {"statusCode": answer.status, "headers": {"Content-Type": "application/json"},
            "body": json.dumps(answer.body)}
