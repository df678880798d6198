"""Launcher Lambda: S3 "Object Created" under queue/ and cancels/ (EventBridge) and the cron backstop."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.aws import common, deployment, events
from jobplane.control import cancels, launcher
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.settings import Settings

LAUNCH_RESERVE_S = 45  # one RunInstances with its retries, and recording the VMs


@common.metrics.log_metrics
@common.logger.inject_lambda_context(clear_state=True)
@event_source(data_class=EventBridgeEvent)
def handler(event: EventBridgeEvent, context: LambdaContext) -> dict[str, Any]:
    if events.kind(event) == events.SCHEDULED:
        env = deployment.environment()
        # what the invocation has left, less one launch's worth: the run ends before Lambda would kill it
        budget = context.get_remaining_time_in_millis() / 1000 - LAUNCH_RESERVE_S
        return launcher.summary(launcher.backstop(env.context(), now=utcnow(), budget=max(budget, 0.0)))
    key = events.registry_key(event, Settings.from_env())
    if key is not None and key.startswith(keys.CANCELS):  # a team member's cancel request
        env = deployment.environment()
        return launcher.summary([cancels.handle(env.context(), key, now=utcnow())])
    drop = keys.parse_drop(key) if key else None
    if key is None or drop is None:
        return launcher.summary([launcher.Outcome(key or "", launcher.Result.IGNORED)])
    common.logger.append_keys(job_id=drop.job_id, owner=drop.owner)
    env = deployment.environment()
    return launcher.summary([launcher.handle_drop(env.context(), key, now=utcnow())])
