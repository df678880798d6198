"""What an S3 "Object Created" event tells the reconciler handlers: which job to look at now."""

from __future__ import annotations

from typing import Any

from functions.aws import common
from jobplane import keys
from jobplane.settings import Settings


def named_job(event: dict[str, Any], settings: Settings) -> str | None:
    """The job an exit-report or preempted-jobs/ object event names (then on every log line), else None."""
    job = keys.job_named_by(common.registry_key(event, settings))
    if job:
        common.logger.append_keys(job_id=job)
    return job
