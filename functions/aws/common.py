"""What every AWS handler builds from its environment: settings, registry, EC2 adapter, policy, telemetry.

Logger(service="jobplane") is the stdlib "jobplane" logger itself, so every core module's log line
(jobplane.launcher, jobplane.aws, ...) propagates to it and comes out as Powertools JSON, with the
job_id each line passes in `extra`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools import Logger, Metrics

from jobplane.clouds.aws import Ec2Compute, ec2_client
from jobplane.clouds.s3 import S3Store, s3_client
from jobplane.clouds.sns import SnsNotifier
from jobplane.notify import Notify
from jobplane.policy import Policy
from jobplane.registry import Registry
from jobplane.settings import Settings

logger = Logger(service="jobplane")
metrics = Metrics(namespace="jobplane", service="jobplane")

_clients: dict[tuple[str | None, str | None], tuple[Any, Any]] = {}
_notifiers: dict[tuple[str, str | None], SnsNotifier] = {}
NOTIFY_TOPIC = "JOBPLANE_NOTIFY_TOPIC"  # the stack's job-notification topic (ARN)


@dataclass(frozen=True)
class Env:
    settings: Settings
    registry: Registry
    compute: Ec2Compute
    policy: Policy
    notify: Notify


def environment() -> Env:
    """Fresh per invocation (the policy may have changed); boto3 clients are reused across invocations. Every
    transition to an end is announced on the notification topic by the run that made it."""
    settings = Settings.from_env()
    where = (settings.region, os.environ.get("AWS_ENDPOINT_URL"))
    if where not in _clients:
        _clients[where] = (s3_client(settings.region), ec2_client(settings.region))
    s3, ec2 = _clients[where]
    notify = Notify(notifier(where[1]), metrics)
    registry = Registry(S3Store(settings.bucket, s3), settings.root, listeners=[notify.transition])
    policy = registry.policy()
    return Env(settings, registry, Ec2Compute(policy.aws, settings.region, ec2), policy, notify)


def notifier(endpoint: str | None) -> SnsNotifier | None:
    """The SNS topic JOBPLANE_NOTIFY_TOPIC names, None without one (notifications off)."""
    topic = os.environ.get(NOTIFY_TOPIC)
    if not topic:
        return None
    if (topic, endpoint) not in _notifiers:
        _notifiers[topic, endpoint] = SnsNotifier(topic)  # a client in the topic's region
    return _notifiers[topic, endpoint]


def registry_key(event: dict[str, Any], settings: Settings) -> str | None:
    """The registry-relative key of an EventBridge S3 "Object Created" event, or None if it is not ours."""
    detail = event.get("detail") or {}
    bucket = (detail.get("bucket") or {}).get("name")
    key = (detail.get("object") or {}).get("key")
    if bucket != settings.bucket or not isinstance(key, str):
        return None
    root = settings.root.strip("/")
    if not root:
        return key
    return key.removeprefix(root + "/") if key.startswith(root + "/") else None
