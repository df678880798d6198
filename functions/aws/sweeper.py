"""Sweeper Lambda: cron, exit reports (S3 "Object Created") and EC2 state changes of managed instances. Each run is
the scheduled pass (jobplane.control.scheduled): the check of the jobs and VMs, then the sweeps' reconcile (every
live sweep, or the one whose trial an event names)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.aws import common, deployment, events, metering
from jobplane.control import scheduled
from jobplane.model.clock import utcnow


@common.metrics.log_metrics
@common.logger.inject_lambda_context(clear_state=True)
@event_source(data_class=EventBridgeEvent)
def handler(event: EventBridgeEvent, context: LambdaContext) -> dict[str, Any]:
    env = deployment.environment()
    job = events.named_job(event, env.settings)
    changed = events.ec2_event(event, events.STATE_CHANGE)
    with metering.api_calls(env):
        done = scheduled.run(env.context(dry_run=events.flag(event, "dry_run")), now=utcnow(),
                             force=events.flag(event, "force"), jobs=[job] if job else [],
                             instance_ids=[changed.instance.instance_id] if changed else [])
    return scheduled.summary(done)
