"""Launcher Lambda: S3 "Object Created" under queue/ (EventBridge) and the cron backstop."""

from __future__ import annotations

from typing import Any

from functions.aws import common
from jobplane import keys, launcher
from jobplane.registry import utcnow
from jobplane.settings import Settings


@common.metrics.log_metrics
@common.logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if event.get("detail-type") == "Scheduled Event":
        env = common.environment()
        return {"outcomes": launcher.backstop(env.registry, env.compute, now=utcnow(), metrics=common.metrics,
                                              policy=env.policy)}
    key = common.registry_key(event, Settings.from_env())
    drop = keys.parse_drop(key) if key else None
    if key is None or drop is None:
        return {"key": key, "outcome": "ignored"}
    common.logger.append_keys(job_id=drop.job_id, owner=drop.owner)
    env = common.environment()
    outcome = launcher.handle_drop(env.registry, env.compute, key, now=utcnow(), metrics=common.metrics,
                                   policy=env.policy)
    return {"key": key, "outcome": outcome}
