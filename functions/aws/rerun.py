"""Rerun Lambda: cron, preempted-jobs/ markers (S3 "Object Created") and EC2 Spot interruption warnings."""

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
        if event.get("detail-type") == "EC2 Spot Instance Interruption Warning":
            iid = str(detail.get("instance-id"))
            result = reconcile.record_spot_warning(env.registry, env.compute, iid, now=utcnow(), detail=detail)
            return {"instance_id": iid, "result": result}
        outcomes = reconcile.rerun(env.registry, env.compute, now=utcnow(), metrics=common.metrics,
                                   policy=env.policy, dry_run=bool(event.get("dry_run")), jobs=[job] if job else [])
    return reconcile.summary(outcomes)
