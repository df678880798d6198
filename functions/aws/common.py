"""What every AWS function shares: the Powertools logger and metrics, and the boto3 clients, reused across
invocations (the control functions' deployment is functions.aws.deployment).

Logger(service="jobplane") is the stdlib "jobplane" logger itself, so every core module's log line
(jobplane.control.launcher, jobplane.aws, ...) propagates to it and comes out as Powertools JSON, with the
job_id each line passes in `extra`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from aws_lambda_powertools import Logger, Metrics

from jobplane.clouds.s3 import s3_client
from jobplane.settings import Settings

logger = Logger(service="jobplane")
metrics = Metrics(namespace="jobplane", service="jobplane")

# boto3 clients are reused across invocations, per service, region, endpoint (AWS_ENDPOINT_URL, which boto3 reads) and
# access key, each made when first asked for: a client costs tens of ms of a cold start (its service model). The key:
# the local cloud runs every function in one process, each with its own role's credentials (jobplane.local.aws).
_clients: dict[tuple[str, str | None, str | None, str | None], Any] = {}


def _ec2_client(region: str | None) -> Any:
    from jobplane.clouds.aws import ec2_client  # the control functions' (functions.aws.deployment imports it)

    return ec2_client(region)


_MAKERS: dict[str, Callable[[str | None], Any]] = {"s3": s3_client, "ec2": _ec2_client}


def endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL")


def access_key() -> str | None:
    """The access key the process's credentials sign with (a client is made for each: see _clients)."""
    return os.environ.get("AWS_ACCESS_KEY_ID")


def client(service: Literal["s3", "ec2"], settings: Settings) -> Any:
    where = (service, settings.region, endpoint(), access_key())
    if where not in _clients:
        _clients[where] = _MAKERS[service](settings.region)
    return _clients[where]
