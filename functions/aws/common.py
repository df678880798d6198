"""What every AWS handler builds from its environment: settings, registry, EC2 adapter, policy, telemetry
(jobplane.deployment.context, over this cloud's adapters).

Logger(service="jobplane") is the stdlib "jobplane" logger itself, so every core module's log line
(jobplane.control.launcher, jobplane.aws, ...) propagates to it and comes out as Powertools JSON, with the
job_id each line passes in `extra`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from aws_lambda_powertools import Logger, Metrics

from jobplane.clouds.aws import Ec2Compute, ec2_client
from jobplane.clouds.s3 import S3Store, s3_client
from jobplane.deployment.context import Adapters, build
from jobplane.deployment.context import Deployment as Env
from jobplane.model.policy import Policy
from jobplane.settings import Settings

if TYPE_CHECKING:
    from jobplane.clouds.sns import SnsNotifier

logger = Logger(service="jobplane")
metrics = Metrics(namespace="jobplane", service="jobplane")

# boto3 clients are reused across invocations, per service, region and endpoint (AWS_ENDPOINT_URL, which boto3
# reads), each made when first asked for: a client costs tens of ms of a cold start (its service model)
_MAKERS: dict[str, Callable[[str | None], Any]] = {"s3": s3_client, "ec2": ec2_client}
_clients: dict[tuple[str, str | None, str | None], Any] = {}
_notifiers: dict[tuple[str, str | None], SnsNotifier] = {}


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL")


def client(service: Literal["s3", "ec2"], settings: Settings) -> Any:
    where = (service, settings.region, _endpoint())
    if where not in _clients:
        _clients[where] = _MAKERS[service](settings.region)
    return _clients[where]


def notifier(settings: Settings) -> SnsNotifier | None:
    """The SNS topic JOBPLANE_NOTIFY_TOPIC names (a client in the topic's region), None without one."""
    if not settings.notify_topic:
        return None
    from jobplane.clouds.sns import SnsNotifier  # only a deployment with a topic publishes

    key = (settings.notify_topic, _endpoint())
    if key not in _notifiers:
        _notifiers[key] = SnsNotifier(settings.notify_topic)
    return _notifiers[key]


def _compute(settings: Settings, policy: Policy) -> Ec2Compute:
    return Ec2Compute(policy.aws, settings.region, client("ec2", settings), deployment=settings.deployment)


ADAPTERS = Adapters(store=lambda settings: S3Store(settings.bucket, client("s3", settings)),
                               compute=_compute, notifier=notifier)


def environment() -> Env:
    """Fresh per invocation (the policy may have changed)."""
    return build(Settings.from_env(), ADAPTERS, metrics)
