"""Rerun Lambda: cron, preempted-jobs/ markers (S3 "Object Created") and EC2 Spot interruption warnings."""

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
    job = events.named_job(event, env.settings)
    warning = events.ec2_event(event, events.SPOT_WARNING)
    with metering.api_calls(env):
        if warning is not None:
            iid = warning.instance.instance_id
            result = reconcile.record_spot_warning(env.registry, env.compute, iid, now=utcnow(),
                                                   detail=warning.instance.raw_event)
            return {"instance_id": iid, "result": result}
        outcomes = reconcile.rerun(env.context(dry_run=events.flag(event, "dry_run")), now=utcnow(),
                                   jobs=[job] if job else [])
    return reconcile.summary(outcomes)
