"""Sweeper Lambda: cron, exit reports (S3 "Object Created") and EC2 state changes of managed instances."""

from __future__ import annotations

from typing import Any

from functions.aws import common, events, metering
from jobplane import reconcile
from jobplane.registry import utcnow


@common.metrics.log_metrics
@common.logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    env = common.environment()
    detail = event.get("detail") or {}
    job = events.named_job(event, env.settings)
    with metering.api_calls(env):
        outcomes = reconcile.sweep(
            env.registry, env.compute, now=utcnow(), metrics=common.metrics, policy=env.policy,
            dry_run=bool(event.get("dry_run")), force=bool(event.get("force")), jobs=[job] if job else [],
            instance_ids=[detail["instance-id"]] if "instance-id" in detail else [], notify=env.notify,
        )
    return reconcile.summary(outcomes)
