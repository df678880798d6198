"""The VM startup script (EC2 user-data, GCE startup-script).

Only where the registry is (cloud, bucket, root, region) and which job and attempt this VM serves reach
the script, each through shlex.quote. Nothing from the spec's setup, run, env, name or labels does: the
agent reads those from the registry. The script
  1. schedules `shutdown -h +N` at the uptime cap, a backstop that holds even if the agent dies
     (EC2 terminates on shutdown; GCE also enforces max_run_duration natively);
  2. installs the agent from the jobplane wheel in system/wheels/ of the bucket, unless jobplane is
     already importable (a prepared image, the local cloud);
  3. runs `python3 -m jobplane.agent`, which takes its settings from the exported JOBPLANE_* variables.
"""

from __future__ import annotations

import math
import shlex

from jobplane import keys
from jobplane.policy import Policy
from jobplane.spec import JobSpec

_COPY = {
    "aws": 'aws s3 cp --only-show-errors --recursive --region "$JOBPLANE_REGION" "$wheel_uri" "$wheels"',
    "gcp": 'gcloud storage cp --recursive "$wheel_uri*" "$wheels"',
}
_SCHEME = {"aws": "s3://", "gcp": "gs://"}

_TEMPLATE = """#!/bin/bash
# jobplane bootstrap (generated): every value below is shell-quoted.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export JOBPLANE_CLOUD={cloud}
export JOBPLANE_BUCKET={bucket}
export JOBPLANE_ROOT={root}
export JOBPLANE_REGION={region}
export JOBPLANE_JOB_ID={job_id}
export JOBPLANE_ATTEMPT={attempt}

# Uptime backstop: power off at the cap even if the agent or the control plane is gone.
shutdown -h +{minutes} "jobplane: uptime cap of {minutes} minutes" || true

if ! python3 -c 'import jobplane.agent' 2>/dev/null; then
  wheels="$(mktemp -d)"
  wheel_uri={wheel_uri}
  {copy}
  python3 -m pip install --quiet --no-index --find-links "$wheels" 'jobplane[{cloud_extra}]' \\
    || python3 -m pip install --quiet --find-links "$wheels" 'jobplane[{cloud_extra}]'
fi

exec python3 -m jobplane.agent
"""


def render(*, cloud: str, bucket: str, root: str, region: str | None, job_id: str, attempt: int,
           uptime_minutes: int) -> str:
    """The startup script for one attempt of one job."""
    if cloud not in _COPY:
        raise ValueError(f"unknown cloud {cloud!r}")
    if uptime_minutes < 1:
        raise ValueError("uptime_minutes must be at least 1")
    root = root.strip("/")
    wheel_prefix = (f"{root}/" if root else "") + keys.agent_wheel_prefix()
    return _TEMPLATE.format(
        cloud=shlex.quote(cloud),
        cloud_extra=cloud,  # checked above: aws | gcp
        bucket=shlex.quote(bucket),
        root=shlex.quote(root),
        region=shlex.quote(region or ""),
        job_id=shlex.quote(job_id),
        attempt=int(attempt),
        minutes=int(uptime_minutes),
        wheel_uri=shlex.quote(f"{_SCHEME[cloud]}{bucket}/{wheel_prefix}"),
        copy=_COPY[cloud],
    )


def uptime_minutes(spec: JobSpec, policy: Policy) -> int:
    """The cap in whole minutes, rounded up so the backstop never fires before the graceful path."""
    return max(1, math.ceil(policy.max_runtime(spec) / 60))


def render_for(spec: JobSpec, *, job_id: str, attempt: int, policy: Policy, bucket: str, root: str,
               region: str | None) -> str:
    """The script for a job: the spec decides only the cloud and (through the policy) the uptime cap."""
    return render(cloud=spec.cloud, bucket=bucket, root=root, region=region, job_id=job_id, attempt=attempt,
                  uptime_minutes=uptime_minutes(spec, policy))
