"""Uptime-cap Lambda (cron): stop requests at cap - grace, terminate + TIMED_OUT at the cap."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.aws import common, deployment, events, metering
from jobplane.control import reconcile
from jobplane.model.clock import utcnow


@common.metrics.log_metrics
@common.logger.inject_lambda_context(clear_state=True)
@event_source(data_class=EventBridgeEvent)
def handler(event: EventBridgeEvent, context: LambdaContext) -> dict[str, Any]:
    env = deployment.environment()
    with metering.api_calls(env):
        outcomes = reconcile.uptime_cap(env.context(dry_run=events.flag(event, "dry_run")), now=utcnow(),
                                        force=events.flag(event, "force"))
    return reconcile.summary(outcomes)
