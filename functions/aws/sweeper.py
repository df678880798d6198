"""Sweeper Lambda: cron, exit reports (S3 "Object Created") and EC2 state changes of managed instances."""

from __future__ import annotations

from typing import Any

from functions.aws import common, metering
from jobplane import reconcile
from jobplane.registry import utcnow


@common.metrics.log_metrics
@common.logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    env = common.environment()
    detail = event.get("detail") or {}
    job = reconcile.job_named_by(common.registry_key(event, env.settings)) if "object" in detail else None
    if job:
        common.logger.append_keys(job_id=job)
    with metering.api_calls(env):
        outcomes = reconcile.sweep(
            env.registry, env.compute, now=utcnow(), metrics=common.metrics, policy=env.policy,
            dry_run=bool(event.get("dry_run")), force=bool(event.get("force")), jobs=[job] if job else [],
            instance_ids=[detail["instance-id"]] if "instance-id" in detail else [],
        )
    return reconcile.summary(outcomes)
