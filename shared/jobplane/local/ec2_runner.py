"""The EC2 instance runner: every managed instance in moto becomes a local process tree (jobplane.local.runner)
with its own fake IMDS, and the runner does what EC2 does: a guest power-off applies the instance's shutdown
behaviour (the launcher sets terminate), a Spot interruption puts the notice in IMDS and sends the
EventBridge warning, then terminates; every state change is an EventBridge event for the trigger loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobplane.clouds.aws_local import LocalAws, RawInstance
from jobplane.clouds.base import TAG_JOB_ID, TAG_RANK
from jobplane.local.imds import FakeImds, ImdsInstance
from jobplane.local.runner import KILL_GRACE, InstanceRunner, Node

log = logging.getLogger("local-cloud")

GONE = ("shutting-down", "terminated", "stopping", "stopped")


class Ec2Runner(InstanceRunner):
    """Call sync() every tick; preempt() and kill() come from the control endpoint."""

    vm_env_prefixes = ("AWS_", "UV_", "PIP_")  # where AWS is (moto) and the package index, as a VM's network says
    # A VM has no keys of this machine's: botocore in it finds its instance role's session in IMDS, as on EC2.
    NOT_A_VMS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                 "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_EC2_METADATA_DISABLED")

    def __init__(self, aws: LocalAws, state_dir: Path, instance_env: dict[str, str], cloud_id: str,
                 on_event: Callable[[dict[str, Any]], None], images: Mapping[str, Path] | None = None,
                 vm_role_arn: str | None = None) -> None:
        env = {k: v for k, v in instance_env.items() if k not in self.NOT_A_VMS}
        super().__init__(state_dir, env, cloud_id, images)
        self.aws = aws
        self.on_event = on_event  # EC2 events (state changes, Spot warnings) for the trigger loop
        self.vm_role_arn = vm_role_arn  # the instance profile's role: IMDS serves a session of it per instance

    def sync(self) -> None:
        with self.lock:
            # a terminated instance is gone either way: a node of one is forgotten as unlisted ones are
            seen = {raw.id: raw for raw in self.aws.instances(managed_only=True, terminated=False)}
            for iid, raw in seen.items():
                if raw.state in ("pending", "running") and iid not in self.nodes and iid not in self.done:
                    self._boot(raw)
            for iid, node in list(self.nodes.items()):
                now = seen.get(iid)
                if now is None or now.state in GONE:
                    self._gone(node, now.state if now else "terminated")
                else:
                    self._watch(node)

    def _boot(self, raw: RawInstance) -> None:
        tagged = raw.tags.get(TAG_RANK)
        rank = int(tagged) if tagged and tagged.isdigit() else raw.launch_index
        role, arn = (self.vm_role_arn.rsplit("/", 1)[-1], self.vm_role_arn) if self.vm_role_arn else (None, "")

        def credentials() -> dict[str, Any]:  # EC2 names the instance role's session after the instance
            return self.aws.role_session(arn, raw.id)

        imds = FakeImds(ImdsInstance(raw.id, launch_index=raw.launch_index, tags=dict(raw.tags),
                                     availability_zone=raw.zone, instance_type=raw.instance_type,
                                     spot=raw.spot, local_ipv4=raw.private_ip or "",
                                     public_ipv4=raw.public_ip, role=role),
                        credentials=credentials if role else None).start()
        node = self.add_node(raw.id, raw.tags.get(TAG_JOB_ID), rank, raw.image_id, imds)
        user_data = self.aws.user_data(raw.id)
        refused = self.refusal(node, [raw.private_ip, raw.public_ip], user_data)
        if refused:
            node.notes.append(f"refused: {refused}")
            self._halt(node, f"refused: {refused}")
            return
        self.on_event(state_change(raw.id, "running"))
        if not user_data.strip():
            log.info("instance %s (%s) is up with no user-data: idle", raw.id, node.job_id or "no job")
            return
        self.start(node, user_data, {"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url})

    def _watch(self, node: Node) -> None:
        self.read_power(node)
        if node.halt_at is not None and node.halt_at <= time.time():
            self._halt(node, node.halt_why)
        elif node.proc is not None and node.proc.poll() is not None:
            self._halt(node, f"user-data exited with code {node.proc.returncode}")

    def _halt(self, node: Node, why: str) -> None:
        """The OS powered off: EC2 applies the instance's shutdown behaviour (the launcher sets terminate)."""
        behaviour = self.aws.shutdown_behavior(node.id)
        log.info("instance %s powered off (%s): %s", node.id, why, behaviour)
        (self.aws.terminate if behaviour == "terminate" else self.aws.stop)([node.id])
        self._gone(node, "terminated" if behaviour == "terminate" else "stopped")

    def _gone(self, node: Node, state: str) -> None:
        killed = self.forget(node, KILL_GRACE)
        self.on_event(state_change(node.id, state))
        log.info("instance %s %s (%d processes ended)", node.id, state, killed)

    def preempt(self, job_id: str, rank: int | None, grace: float) -> list[dict[str, Any]]:
        """EC2 Spot interruption: the notice in IMDS and as an event now, termination after grace."""
        out = []
        with self.lock:
            for node in self.select(job_id, rank):
                when = time.time() + grace
                notice = node.metadata.set_notice("terminate", datetime.fromtimestamp(when, UTC))
                node.halt_at, node.halt_why = when, "Spot interruption"
                self.on_event(spot_warning(node.id))
                out.append({"instance_id": node.id, "rank": node.rank, "notice": notice})
        return out

    def died(self, node: Node) -> None:
        self._halt(node, "killed")


def state_change(instance_id: str, state: str) -> dict[str, Any]:
    return {"detail-type": "EC2 Instance State-change Notification", "source": "aws.ec2",
            "detail": {"instance-id": instance_id, "state": state}}


def spot_warning(instance_id: str) -> dict[str, Any]:
    return {"detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
            "detail": {"instance-id": instance_id, "instance-action": "terminate"}}
