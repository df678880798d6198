"""Instance runner: every managed EC2 instance in moto becomes a local process running its real user-data.

Each instance gets a scratch root, its own fake IMDS, and shims for shutdown/poweroff/halt placed before
everything else: the shims only append to the instance's power log, and the runner turns that into what
EC2 would do (terminate or stop the instance, now or at the scheduled time). The real commands never run.
What the instance runs on depends on its AMI: an image the local cloud registered with a root filesystem
(the stock Debian 12 image, jobplane.local.rootfs) runs its user-data inside that tree, in its own
namespaces; any other AMI runs on this machine, with the local cloud's Python first on PATH and its
/opt/ml and /opt/jobplane under the scratch root.

Processes are found by an environment marker every descendant inherits, so killing an instance kills
everything it started, even processes that moved to their own session.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from jobplane.clouds.aws_local import LocalAws, RawInstance, on_loopback
from jobplane.clouds.base import TAG_JOB_ID, TAG_RANK
from jobplane.local import rootfs
from jobplane.local.imds import FakeImds, ImdsInstance

log = logging.getLogger("local-cloud")  # not under "jobplane": the functions' Powertools Logger owns that

POWER_COMMANDS = ("shutdown", "poweroff", "halt")
SHIM = """#!/bin/sh
# jobplane local cloud: stands in for the real {name}, which must never run here. It only records the
# call; the instance runner terminates (or stops) this instance in moto, now or at the scheduled time.
log="${{JOBPLANE_LOCAL_POWER_LOG:?{name}: not on a local-cloud instance, refusing}}"
printf '%s %s %s\\n' "$(date +%s)" "{name}" "$*" >> "$log"
"""
# A user-data that names a power command by absolute path would bypass the shims: refuse to run it.
UNSAFE = re.compile(r"(/s?bin/(shutdown|poweroff|halt|reboot)\b|systemctl\s+(poweroff|halt|reboot)|\binit\s+[06]\b)")
GONE = ("shutting-down", "terminated", "stopping", "stopped")
# The agent's loops, tightened so a demo sees logs, heartbeats and checkpoints within seconds.
AGENT_ENV = {"JOBPLANE_AGENT_LOG_INTERVAL": "2", "JOBPLANE_AGENT_HEARTBEAT_INTERVAL": "5",
             "JOBPLANE_AGENT_CHECKPOINT_INTERVAL": "5", "JOBPLANE_AGENT_POLL_INTERVAL": "1"}
# Every local instance's network interface is lo: collective libraries must not pick another one.
NETWORK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
KILL_GRACE = 2.0  # SIGTERM, then SIGKILL: what an OS shutdown does to stragglers, only faster
# What an instance inside an image sees of this machine's environment: where AWS is (moto) and the
# package index (loopback), as a VM would learn them from its network.
VM_ENV_PREFIXES = ("AWS_", "UV_", "PIP_")


def write_shims(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in POWER_COMMANDS:
        path = directory / name
        path.write_text(SHIM.format(name=name))
        path.chmod(0o755)
    return directory


def marked_pids(marker: str) -> list[int]:
    """Pids of our processes whose environment carries marker (e.g. JOBPLANE_LOCAL_INSTANCE=i-123)."""
    needle = marker.encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue  # gone, or not ours
        if needle in environ.split(b"\0"):
            pids.append(int(entry))
    return pids


def kill_marked(marker: str, grace: float = KILL_GRACE) -> int:
    """SIGTERM every marked process, SIGKILL what is left after grace; returns how many there were."""
    pids = marked_pids(marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline and marked_pids(marker):
            time.sleep(0.05)
        if not marked_pids(marker):
            break
    return len(pids)


def parse_power(line: str) -> tuple[str, float | None] | None:
    """One shim record -> ("halt", when) or ("cancel", None); None when the line is not a power request.

    shutdown follows systemd: no time means +1 minute, "now" or +0 means now, +N means N minutes, hh:mm
    the next such wall-clock time; -c cancels a pending shutdown. poweroff and halt act at once.
    """
    parts = line.split()
    if len(parts) < 2:
        return None
    stamp, cmd, args = float(parts[0]), parts[1], parts[2:]
    if cmd in ("poweroff", "halt"):
        return "halt", stamp
    if cmd != "shutdown":
        return None
    if "-c" in args:
        return "cancel", None
    when = next((a for a in args if a == "now" or a.startswith("+") or re.fullmatch(r"\d{1,2}:\d{2}", a)), None)
    if when is None:
        return "halt", stamp + 60
    if when == "now":
        return "halt", stamp
    if when.startswith("+"):
        return "halt", stamp + 60 * int(when[1:] or 0)
    hh, mm = (int(x) for x in when.split(":"))
    now = time.localtime(stamp)
    delta = ((hh - now.tm_hour) * 60 + (mm - now.tm_min)) % (24 * 60)
    return "halt", stamp + 60 * delta - now.tm_sec


@dataclass
class Node:
    raw: RawInstance
    root: Path
    imds: FakeImds
    marker: str
    power_log: Path
    proc: subprocess.Popen[bytes] | None = None
    console: IO[bytes] | None = None
    power_seen: int = 0  # bytes of the power log already acted on
    halt_at: float | None = None  # epoch seconds: a scheduled shutdown or the Spot reclaim
    halt_why: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def job_id(self) -> str | None:
        return self.raw.tags.get(TAG_JOB_ID)

    @property
    def rank(self) -> int:
        tagged = self.raw.tags.get(TAG_RANK)
        return int(tagged) if tagged and tagged.isdigit() else self.raw.launch_index


class InstanceRunner:
    """Call sync() every tick; preempt(), kill() and create() come from the control endpoint."""

    def __init__(self, aws: LocalAws, state_dir: Path, instance_env: dict[str, str], cloud_id: str,
                 on_event: Callable[[dict[str, Any]], None], images: Mapping[str, Path] | None = None) -> None:
        self.aws = aws
        self.images = dict(images or {})  # AMI id -> root filesystem; any other AMI runs on this machine
        self.state_dir = state_dir
        self.shims = write_shims(state_dir / "shims")
        self.instance_env = instance_env
        self.cloud_id = cloud_id
        self.on_event = on_event  # EC2 events (state changes, Spot warnings) for the trigger loop
        self.nodes: dict[str, Node] = {}
        self.done: set[str] = set()  # instances that ran and are gone; never started again
        self.lock = threading.RLock()

    # ---- the tick ------------------------------------------------------------------------------------
    def sync(self) -> None:
        with self.lock:
            seen = {raw.id: raw for raw in self.aws.instances(managed_only=True)}
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
        root = self.state_dir / "instances" / raw.id
        image = self.images.get(raw.image_id)
        share = root / "share" if image else root  # what the instance and the runner both see
        share.mkdir(parents=True, exist_ok=True)
        imds = FakeImds(ImdsInstance(raw.id, launch_index=raw.launch_index, tags=dict(raw.tags),
                                     availability_zone=raw.zone, instance_type=raw.instance_type,
                                     spot=raw.spot, local_ipv4=raw.private_ip or "",
                                     public_ipv4=raw.public_ip)).start()
        node = Node(raw, root, imds, marker=f"JOBPLANE_LOCAL_INSTANCE={raw.id}", power_log=share / "power.log")
        self.nodes[raw.id] = node
        outside = [ip for ip in (raw.private_ip, raw.public_ip) if ip and not on_loopback(ip)]
        if outside or not raw.private_ip:  # a job there would send traffic off this machine
            log.error("instance %s: address %s is not on loopback (127.0.0.0/8); refusing to boot it", raw.id,
                      ", ".join(outside) or "(none)")
            node.notes.append(f"refused: address {', '.join(outside) or '(none)'} not on loopback")
            self._halt(node, "refused: not on loopback")
            return
        user_data = self.aws.user_data(raw.id)
        self.on_event(state_change(raw.id, "running"))
        if not user_data.strip():
            log.info("instance %s (%s) is up with no user-data: idle", raw.id, node.job_id or "no job")
            return
        if UNSAFE.search(user_data):
            log.error("instance %s: user-data calls a power command by absolute path; refusing to run it", raw.id)
            node.notes.append("refused: absolute power command in user-data")
            self._halt(node, "refused user-data")
            return
        (share / "user-data").write_text(user_data)
        ours = {**AGENT_ENV, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url, "JOBPLANE_LOCAL_INSTANCE": raw.id,
                "JOBPLANE_LOCAL_CLOUD": self.cloud_id, **NETWORK_ENV}
        if image:
            inside = {**{k: v for k, v in self.instance_env.items() if k.startswith(VM_ENV_PREFIXES)}, **ours,
                      "PATH": rootfs.PATH, "HOME": "/root", "JOBPLANE_LOCAL_POWER_LOG": f"{rootfs.SHARE}/power.log"}
            shims = {name: SHIM.format(name=name) for name in rootfs.POWER_COMMANDS}
            command = rootfs.sandbox(image, root, inside, shims)
            env = {**ours, "PATH": rootfs.PATH}  # this machine's: unshare, mount, chroot
        else:
            (root / "home").mkdir(exist_ok=True)
            (root / "tmp").mkdir(exist_ok=True)
            command = ["bash", str(share / "user-data")]
            env = {**self.instance_env, **ours, "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"),
                   "JOBPLANE_ML_ROOT": str(root / "opt" / "ml"), "JOBPLANE_AGENT_HOME": str(root / "opt" / "jobplane"),
                   "JOBPLANE_LOCAL_POWER_LOG": str(node.power_log),
                   "PATH": os.pathsep.join([str(self.shims), str(Path(sys.executable).parent),
                                            self.instance_env.get("PATH", os.defpath)])}
        node.console = (root / "console.log").open("ab")
        node.proc = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=node.console,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.info("instance %s: job %s rank %d booted on %s (pid %d, console %s)", raw.id, node.job_id, node.rank,
                 image or "this machine", node.proc.pid, root / "console.log")

    def _watch(self, node: Node) -> None:
        power_log = node.power_log
        if power_log.exists():
            data = power_log.read_bytes()
            for line in data[node.power_seen:].decode(errors="replace").splitlines():
                parsed = parse_power(line)
                if parsed and parsed[0] == "cancel":
                    node.halt_at, node.halt_why = None, ""
                elif parsed:
                    node.halt_at, node.halt_why = parsed[1], line.split(maxsplit=1)[1]
            node.power_seen = len(data)
        if node.halt_at is not None and node.halt_at <= time.time():
            self._halt(node, node.halt_why)
        elif node.proc is not None and node.proc.poll() is not None:
            self._halt(node, f"user-data exited with code {node.proc.returncode}")

    def _halt(self, node: Node, why: str) -> None:
        """The OS powered off: EC2 applies the instance's shutdown behaviour (the launcher sets terminate)."""
        behaviour = self.aws.shutdown_behavior(node.raw.id)
        log.info("instance %s powered off (%s): %s", node.raw.id, why, behaviour)
        (self.aws.terminate if behaviour == "terminate" else self.aws.stop)([node.raw.id])
        self._gone(node, "terminated" if behaviour == "terminate" else "stopped")

    def _gone(self, node: Node, state: str) -> None:
        killed = self._end(node, KILL_GRACE)
        del self.nodes[node.raw.id]
        self.done.add(node.raw.id)
        self.on_event(state_change(node.raw.id, state))
        log.info("instance %s %s (%d processes ended)", node.raw.id, state, killed)

    @staticmethod
    def _end(node: Node, grace: float) -> int:
        """Everything the instance runs is killed and its IMDS stopped: the VM is gone."""
        killed = kill_marked(node.marker, grace)
        if node.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=5)
        if node.console:
            node.console.close()
        node.imds.stop()
        return killed

    # ---- control ------------------------------------------------------------------------------------
    def select(self, job_id: str, rank: int | None) -> list[Node]:
        with self.lock:
            return [n for n in self.nodes.values() if n.job_id == job_id and (rank is None or n.rank == rank)]

    def preempt(self, job_id: str, rank: int | None, grace: float) -> list[dict[str, Any]]:
        """EC2 Spot interruption: the notice in IMDS and as an event now, termination after grace."""
        out = []
        with self.lock:
            for node in self.select(job_id, rank):
                when = time.time() + grace
                notice = node.imds.set_notice("terminate", datetime.fromtimestamp(when, UTC))
                node.halt_at, node.halt_why = when, "Spot interruption"
                self.on_event(spot_warning(node.raw.id))
                out.append({"instance_id": node.raw.id, "rank": node.rank, "notice": notice})
        return out

    def kill(self, job_id: str, rank: int | None) -> list[str]:
        """The VM dies without warning (hardware, kernel panic): every process killed, the instance gone."""
        with self.lock:
            victims = self.select(job_id, rank)
            for node in victims:
                kill_marked(node.marker, grace=0)
                self._halt(node, "killed")
            return [n.raw.id for n in victims]

    def status(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"instance_id": n.raw.id, "job_id": n.job_id, "rank": n.rank, "root": str(n.root),
                     "pid": n.proc.pid if n.proc else None, "halt_at": n.halt_at, "notes": n.notes}
                    for n in self.nodes.values()]

    def stop_all(self) -> None:
        """Local cloud shutting down: end every instance process (the instances stay in moto, which stops too)."""
        with self.lock:
            for node in list(self.nodes.values()):
                self._end(node, 1.0)
            self.nodes.clear()
        kill_marked(f"JOBPLANE_LOCAL_CLOUD={self.cloud_id}", grace=1.0)


def state_change(instance_id: str, state: str) -> dict[str, Any]:
    return {"detail-type": "EC2 Instance State-change Notification", "source": "aws.ec2",
            "detail": {"instance-id": instance_id, "state": state}}


def spot_warning(instance_id: str) -> dict[str, Any]:
    return {"detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
            "detail": {"instance-id": instance_id, "instance-action": "terminate"}}


def clean(state_dir: Path) -> None:
    shutil.rmtree(state_dir / "instances", ignore_errors=True)
