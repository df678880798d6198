"""`jobplane ssh`: which VM of a job a shell goes to, and the command that opens it. Pure.

No VM ever opens an inbound port for it: on AWS the shell goes through SSM Session Manager (the agent-less SSM
agent on the VM dials out; the VM role's SSM grant is the deployment's `jobplane:ssh`), on GCP through IAP TCP
forwarding (a firewall rule admitting IAP's range on port 22, the deployment's `ssh_via_iap`). The policy's
`access.ssh` turns the command on; who may use it is IAM's answer (ssm:StartSession on the instances tagged
jobplane:managed; iap.tunnelInstances.accessViaIAP).
"""

from __future__ import annotations

import json
from datetime import datetime

from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import State

IAP_RANGE = "35.235.240.0/20"  # where IAP TCP forwarding connects from (Google's documented range)


class ShellError(Exception):
    """Why no shell can be opened (one line, for the CLI)."""


def target(record: JobRecord, rank: int, now: datetime) -> str:
    """The instance of the job's current attempt that runs `rank`: a live job's, or a FAILED one's that its
    debug_hold keeps."""
    if record.terminal and not record.held(now):
        hint = " (a spec's `debug_hold: 30m` keeps a failed attempt's VMs for a look)" \
            if record.state == State.FAILED and record.held_until is None else ""
        raise ShellError(f"job {record.id} is {record.state}: its VMs are gone{hint}")
    if not record.instances:
        raise ShellError(f"job {record.id} is {record.state}: no VM yet (attempt {record.attempt})")
    if not 0 <= rank < len(record.instances):
        raise ShellError(f"job {record.id} has ranks 0 to {len(record.instances) - 1}, not {rank}")
    return record.instances[rank]


def ssm_argv(instance_id: str, region: str | None, command: list[str]) -> list[str]:
    """aws ssm start-session: an interactive shell, or the command (AWS-StartInteractiveCommand). A command's
    words are joined with spaces and run by the VM's shell, as ssh does."""
    argv = ["aws", "ssm", "start-session", "--target", instance_id, *(["--region", region] if region else [])]
    if command:
        argv += ["--document-name", "AWS-StartInteractiveCommand",
                 "--parameters", json.dumps({"command": [' '.join(command)]})]
    return argv


def iap_argv(instance_id: str, project: str | None, command: list[str]) -> list[str]:
    """gcloud compute ssh through IAP; instance_id is the Compute adapter's zone/name."""
    zone, _, name = instance_id.partition("/")
    argv = ["gcloud", "compute", "ssh", name, "--zone", zone, "--tunnel-through-iap",
            *(["--project", project] if project else [])]
    return argv + (["--command", ' '.join(command)] if command else [])
