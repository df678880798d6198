"""Uptime-cap Lambda (cron): stop requests at cap - grace, terminate + TIMED_OUT at the cap."""

from __future__ import annotations

from typing import Any

from functions.aws import common, metering
from jobplane import reconcile
from jobplane.registry import utcnow


@common.metrics.log_metrics
@common.logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    env = common.environment()
    with metering.api_calls(env):
        outcomes = reconcile.uptime_cap(env.registry, env.compute, now=utcnow(), metrics=common.metrics,
                                        policy=env.policy, dry_run=bool(event.get("dry_run")),
                                        force=bool(event.get("force")))
    return reconcile.summary(outcomes)
