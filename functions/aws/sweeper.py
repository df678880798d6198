"""Sweeper Lambda: cron, exit reports (S3 "Object Created") and EC2 state changes of managed instances. Each run
sweeps the jobs, then reconciles the sweeps (jobplane.sweeps): every live one, or the one whose trial an event
names."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.aws import common, events, metering
from jobplane.control import reconcile
from jobplane.store.registry import utcnow
from jobplane.sweeps import run as sweeps


@common.metrics.log_metrics
@common.logger.inject_lambda_context(clear_state=True)
@event_source(data_class=EventBridgeEvent)
def handler(event: EventBridgeEvent, context: LambdaContext) -> dict[str, Any]:
    env = common.environment()
    job = events.named_job(event, env.settings)
    changed = events.ec2_event(event, events.STATE_CHANGE)
    ctx, now, jobs = env.context(dry_run=events.flag(event, "dry_run")), utcnow(), [job] if job else []
    with metering.api_calls(env):
        outcomes = reconcile.check(ctx, now=now, force=events.flag(event, "force"), jobs=jobs,
                                   instance_ids=[changed.instance.instance_id] if changed else [])
        swept = sweeps.reconcile(ctx, now=now, jobs=jobs)  # after the job sweep: a trial it ended is replaced now
    return {**reconcile.summary(outcomes), **(sweeps.summary(swept) if swept else {})}
