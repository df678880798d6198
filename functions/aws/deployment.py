"""What the control functions (launcher, sweeper, rerun, uptime_cap) build at each invocation: the deployment
(jobplane.deployment.context) over this cloud's adapters: S3 for the registry, EC2 placed by the policy, SNS for
notifications. The vend function reads no policy and drives no VM, so it imports only functions.aws.common."""

from __future__ import annotations

from typing import TYPE_CHECKING

from functions.aws.common import access_key, client, endpoint, metrics
from jobplane.clouds.aws import Ec2Compute
from jobplane.clouds.s3 import S3Store
from jobplane.deployment.context import Adapters, build
from jobplane.deployment.context import Deployment as Env
from jobplane.model.policy import Policy
from jobplane.settings import Settings

if TYPE_CHECKING:
    from jobplane.clouds.sns import SnsNotifier

_notifiers: dict[tuple[str, str | None, str | None], SnsNotifier] = {}


def notifier(settings: Settings) -> SnsNotifier | None:
    """The SNS topic JOBPLANE_NOTIFY_TOPIC names (a client in the topic's region), None without one."""
    if not settings.notify_topic:
        return None
    from jobplane.clouds.sns import SnsNotifier  # only a deployment with a topic publishes

    key = (settings.notify_topic, endpoint(), access_key())
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
