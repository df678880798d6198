"""Deployment settings of the control plane, read from cdk.json context (or `cdk -c key=value`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from constructs import Construct

PREFIX = "jobplane:"

# Where each function's cron lives in the context, and its default.
SCHEDULES = {
    "launcher": ("launcherBackstopSchedule", "rate(5 minutes)"),
    "sweeper": ("sweepSchedule", "rate(5 minutes)"),
    "rerun": ("rerunSchedule", "rate(5 minutes)"),
    "uptime_cap": ("uptimeCapSchedule", "rate(5 minutes)"),
}


@dataclass(frozen=True)
class ControlPlaneConfig:
    """Everything a platform team chooses at deploy time; the defaults deploy a working control plane."""

    bucket_name: str | None = None  # None: CloudFormation names it
    root: str = ""  # registry root prefix inside the bucket
    schedules: dict[str, str] = field(default_factory=lambda: {k: d for k, (_, d) in SCHEDULES.items()})
    # Default caps written to config/policy.yaml (the stack adds the aws placement it created).
    policy: dict[str, Any] = field(default_factory=dict)
    # The new VPC's egress (ignored with vpc_id): public | private-nat | isolated; see control_plane.NETWORKS.
    network: str = "public"
    vpc_id: str | None = None  # None: a new VPC (as `network` says) with an S3 gateway endpoint
    subnet_ids: tuple[str, ...] = ()
    alarm_email: str | None = None
    notify_email: str | None = None  # subscribed to the job-notification topic (a job ended, idle GPUs)
    dashboard: bool = False  # a CloudWatch dashboard: $3/month, most of an idle deployment's bill
    data_buckets: tuple[str, ...] = ()  # buckets VMs may read job inputs from (read-only)
    # ECR repositories (names in the stack's account and region, or ARNs) VMs may pull job containers from
    container_repositories: tuple[str, ...] = ()
    ssh: bool = False  # VMs reachable through SSM Session Manager (`jobplane ssh`; the policy's access.ssh too)
    # VM Pythons the agent bundles are built for, besides the image aliases' own (3.11, 3.12): add yours
    vm_pythons: tuple[str, ...] = ("3.11", "3.12")
    # reserved concurrency, 33 in all (1 per reconciler, launcher 10, vend 20): off where the account's limit is under
    # 133 (Lambda keeps 100 unreserved), as for a new account's 10
    reserved_concurrency: bool = True
    log_retention_days: int = 30  # Lambda log groups
    log_chunk_days: int = 90  # registry log chunks tagged jobplane:object=log expire after this

    @property
    def key_prefix(self) -> str:
        """The registry root as an S3 key prefix ("" or "team-a/"), as Registry applies it."""
        root = self.root.strip("/")
        return f"{root}/" if root else ""

    @classmethod
    def from_context(cls, scope: Construct) -> ControlPlaneConfig:
        def get(name: str, default: Any = None) -> Any:
            value = scope.node.try_get_context(PREFIX + name)
            return default if value in (None, "") else value

        defaults = cls()
        return cls(
            bucket_name=get("bucketName"),
            root=get("root", ""),
            schedules={fn: str(get(key, default)) for fn, (key, default) in SCHEDULES.items()},
            policy=_as_json(get("policy", {})),
            network=str(get("network", defaults.network)),
            vpc_id=get("vpcId"),
            subnet_ids=tuple(_as_list(get("subnetIds", []))),
            alarm_email=get("alarmEmail"),
            notify_email=get("notifyEmail"),
            dashboard=_as_bool(get("dashboard", False)),
            data_buckets=tuple(_as_list(get("dataBuckets", []))),
            container_repositories=tuple(_as_list(get("containerRepositories", []))),
            ssh=_as_bool(get("ssh", False)),
            vm_pythons=tuple(_as_list(get("vmPythonVersions", list(defaults.vm_pythons)))),
            reserved_concurrency=_as_bool(get("reservedConcurrency", True)),
            log_retention_days=int(get("logRetentionDays", defaults.log_retention_days)),
            log_chunk_days=int(get("logChunkDays", defaults.log_chunk_days)),
        )


# `cdk -c key=value` passes strings; cdk.json passes JSON values. Accept both.
def _as_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        value = json.loads(value) if value.lstrip().startswith("[") else value.split(",")
    return [str(v).strip() for v in value if str(v).strip()]


def _as_bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")
