"""What the EC2 and GCE instance runners share: each VM of the cloud becomes a local process tree running its
real startup script (EC2 user-data, GCE startup-script), with its own metadata server and shims for
shutdown/poweroff/halt placed before everything else (jobplane.local.ec2_runner, jobplane.local.gce_runner).

The shims only append to the VM's power log; the runner turns that into what the cloud does when a guest
powers off. The real commands never run. What a VM runs on depends on its image: an image the local cloud
built a root filesystem for (the stock Debian 12 image, jobplane.local.rootfs) runs the script inside that
tree, in its own namespaces; any other image runs on this machine, with the local cloud's Python first on
PATH and its /opt/ml and /opt/jobplane under the VM's scratch root.

Processes are found by an environment marker every descendant inherits, so ending a VM ends everything it
started, even processes that moved to their own session.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from jobplane.agent.process import marked_pids
from jobplane.boot.bootstrap import AGENT_HOME
from jobplane.local import rootfs
from jobplane.local.baked_agent import bake, bake_on_host
from jobplane.local.loopback import on_loopback

log = logging.getLogger("local-cloud")  # not under "jobplane": the functions' loggers own that

POWER_COMMANDS = ("shutdown", "poweroff", "halt")
SHIM = """#!/bin/sh
# jobplane local cloud: stands in for the real {name}, which must never run here. It only records the
# call; the instance runner powers this VM off in its cloud, now or at the scheduled time.
log="${{JOBPLANE_LOCAL_POWER_LOG:?{name}: not on a local-cloud instance, refusing}}"
printf '%s %s %s\\n' "$(date +%s)" "{name}" "$*" >> "$log"
"""
# A script that names a power command by absolute path would bypass the shims: refuse to run it.
UNSAFE = re.compile(r"(/s?bin/(shutdown|poweroff|halt|reboot)\b|systemctl\s+(poweroff|halt|reboot)|\binit\s+[06]\b)")
# The agent's loops, tightened so a demo sees logs, heartbeats and checkpoints within seconds.
AGENT_ENV = {"JOBPLANE_AGENT_LOG_INTERVAL": "2", "JOBPLANE_AGENT_HEARTBEAT_INTERVAL": "5",
             "JOBPLANE_AGENT_CHECKPOINT_INTERVAL": "5", "JOBPLANE_AGENT_POLL_INTERVAL": "1"}
# Every local VM's network interface is lo: collective libraries must not pick another one.
NETWORK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
KILL_GRACE = 2.0  # SIGTERM, then SIGKILL: what an OS shutdown does to stragglers, only faster
MARKER = "JOBPLANE_LOCAL_INSTANCE"


def write_shims(directory: Path, extra: Mapping[str, str] | None = None) -> Path:
    """The power shims (and any extra name -> script) in directory, executable."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in {**{n: SHIM.format(name=n) for n in POWER_COMMANDS}, **(extra or {})}.items():
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)
    return directory


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
    """One VM as a local process tree."""

    id: str
    job_id: str | None
    rank: int
    root: Path  # the VM's scratch root
    share: Path  # what the VM and the runner both see (its root, or the image's shared directory)
    image: Path | None  # the root filesystem it boots, or None: this machine
    metadata: Any  # its metadata server (FakeImds, FakeGceMetadataServer): stopped with the VM
    proc: subprocess.Popen[bytes] | None = None
    console: IO[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # what its scripts run with (inside its image, if any)
    power_seen: int = 0  # bytes of the power log already acted on
    halt_at: float | None = None  # epoch seconds: a scheduled shutdown, a reclaim, an uptime cap
    halt_why: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def agent_home(self) -> Path:
        """Where a VM on this machine keeps its agent (a VM in an image: the image's /opt/jobplane)."""
        return self.root / "opt" / "jobplane"

    @property
    def marker(self) -> str:
        return f"{MARKER}={self.id}"

    @property
    def power_log(self) -> Path:
        return self.share / "power.log"


class InstanceRunner:
    """The machinery; a cloud's runner lists its VMs and applies what its cloud does to them (sync())."""

    vm_env_prefixes: tuple[str, ...] = ()  # what a VM inside an image sees of this machine's environment

    def __init__(self, state_dir: Path, instance_env: dict[str, str], cloud_id: str,
                 images: Mapping[str, Path] | None = None, shims: Mapping[str, str] | None = None) -> None:
        self.images = dict(images or {})  # image -> root filesystem; any other image runs on this machine
        self.state_dir = state_dir
        self.extra_shims = dict(shims or {})
        self.shims = write_shims(state_dir / "shims", self.extra_shims)
        self.instance_env = instance_env
        self.cloud_id = cloud_id
        self.nodes: dict[str, Node] = {}
        self.done: set[str] = set()  # VMs that ran and are gone; never started again
        self.lock = threading.RLock()
        self.baked_agent: Path | None = None  # the agent tree every VM's image holds (`local up --baked-agent`)

    # ---- booting ------------------------------------------------------------------------------------
    def add_node(self, iid: str, job_id: str | None, rank: int, image: str, metadata: Any) -> Node:
        root = self.state_dir / "instances" / iid
        rootfs_dir = self.images.get(image)
        share = root / "share" if rootfs_dir else root
        share.mkdir(parents=True, exist_ok=True)
        node = Node(iid, job_id, rank, root, share, rootfs_dir, metadata)
        self.nodes[iid] = node
        return node

    def refusal(self, node: Node, addresses: list[str | None], script: str) -> str | None:
        """Why this VM must not run (an address off loopback, a script that bypasses the shims), or None."""
        outside = [ip for ip in addresses if ip and not on_loopback(ip)]
        if outside or not any(addresses):  # a job there would send traffic off this machine
            why = f"address {', '.join(outside) or '(none)'} not on loopback"
            log.error("instance %s: %s (127.0.0.0/8); refusing to boot it", node.id, why)
            return why
        if UNSAFE.search(script):
            log.error("instance %s: its startup script calls a power command by absolute path; refusing to run it",
                      node.id)
            return "absolute power command in its startup script"
        return None

    def start(self, node: Node, script: str, ours: dict[str, str]) -> None:
        """Run the VM's startup script; ours: what the cloud tells this VM (its metadata server...)."""
        (node.share / "user-data").write_text(script)
        if self.baked_agent is not None:  # in the image: its overlay's upper layer; on this machine: its own home
            if node.image:
                bake(self.baked_agent, node.root / "upper" / AGENT_HOME.lstrip("/"))
            else:
                bake_on_host(self.baked_agent, node.agent_home)
        ours = {**AGENT_ENV, **ours, MARKER: node.id, "JOBPLANE_LOCAL_CLOUD": self.cloud_id, **NETWORK_ENV}
        if node.image:
            node.env = {**{k: v for k, v in self.instance_env.items() if k.startswith(self.vm_env_prefixes)},
                        **ours, "PATH": rootfs.PATH, "HOME": "/root",
                        "JOBPLANE_LOCAL_POWER_LOG": f"{rootfs.SHARE}/power.log"}
            shims = {name: SHIM.format(name=name) for name in rootfs.POWER_COMMANDS}
            command = rootfs.sandbox(node.image, node.root, node.env, shims)
            env = {**ours, "PATH": rootfs.PATH}  # this machine's: unshare, mount, chroot
        else:
            node.env = env = self.host_env(node, ours)
            command = ["bash", str(node.share / "user-data")]
        node.console = (node.root / "console.log").open("ab")
        node.proc = subprocess.Popen(command, cwd=node.root, env=env, stdin=subprocess.DEVNULL, stdout=node.console,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.info("instance %s: job %s rank %d booted on %s (pid %d, console %s)", node.id, node.job_id, node.rank,
                 node.image or "this machine", node.proc.pid, node.root / "console.log")

    def host_env(self, node: Node, ours: dict[str, str]) -> dict[str, str]:
        """A VM on this machine: its own home, tmp, /opt/ml and /opt/jobplane, the shims first on PATH."""
        for sub in ("home", "tmp"):
            (node.root / sub).mkdir(exist_ok=True)
        return {**self.instance_env, **ours, "HOME": str(node.root / "home"),
                "TMPDIR": str(node.root / "tmp"), "JOBPLANE_ML_ROOT": str(node.root / "opt" / "ml"),
                "JOBPLANE_AGENT_HOME": str(node.agent_home),
                "JOBPLANE_LOCAL_POWER_LOG": str(node.power_log),
                "PATH": os.pathsep.join([str(self.shims), str(Path(sys.executable).parent),
                                         self.instance_env.get("PATH", os.defpath)])}

    # ---- watching -----------------------------------------------------------------------------------
    @staticmethod
    def read_power(node: Node) -> None:
        """Act on new shim records: a shutdown scheduled, moved or cancelled."""
        if not node.power_log.exists():
            return
        data = node.power_log.read_bytes()
        for line in data[node.power_seen:].decode(errors="replace").splitlines():
            parsed = parse_power(line)
            if parsed and parsed[0] == "cancel":
                node.halt_at, node.halt_why = None, ""
            elif parsed:
                node.halt_at, node.halt_why = parsed[1], line.split(maxsplit=1)[1]
        node.power_seen = len(data)

    def forget(self, node: Node, grace: float = KILL_GRACE) -> int:
        """The VM is gone: everything it runs is killed, its metadata server stopped; returns the process count."""
        killed = kill_marked(node.marker, grace)
        if node.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=5)
        if node.console:
            node.console.close()
        node.metadata.stop()
        self.nodes.pop(node.id, None)
        self.done.add(node.id)
        return killed

    # ---- control ------------------------------------------------------------------------------------
    def select(self, job_id: str, rank: int | None) -> list[Node]:
        with self.lock:
            return [n for n in self.nodes.values() if n.job_id == job_id and (rank is None or n.rank == rank)]

    def kill(self, job_id: str, rank: int | None) -> list[str]:
        """The VM dies without warning (hardware, kernel panic): every process killed at once, then what its
        cloud does with a VM that died (died())."""
        with self.lock:
            victims = self.select(job_id, rank)
            for node in victims:
                kill_marked(node.marker, grace=0)
                self.died(node)
            return [n.id for n in victims]

    def died(self, node: Node) -> None:
        raise NotImplementedError

    def shell(self, instance_id: str) -> dict[str, Any]:
        """How `jobplane ssh` enters this VM: {argv, env, cwd} of a bash that is one of its processes (inside its
        image, or on this machine with its environment and marker), to which `-c CMD` may be appended."""
        with self.lock:
            node = self.nodes.get(instance_id)
            argv = None
            if node is not None and node.proc is not None:
                argv = rootfs.enter(node.proc.pid, node.env, ["/bin/bash"]) if node.image else ["bash"]
            if node is None or argv is None:
                return {"error": f"instance {instance_id} is not running in this local cloud"}
            if node.image:
                return {"argv": argv, "env": {"PATH": rootfs.PATH}, "cwd": "/"}
            return {"argv": argv, "env": node.env, "cwd": str(node.root)}

    def status(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"instance_id": n.id, "job_id": n.job_id, "rank": n.rank, "root": str(n.root),
                     "pid": n.proc.pid if n.proc else None, "halt_at": n.halt_at, "notes": n.notes}
                    for n in self.nodes.values()]

    def stop_all(self) -> None:
        """Local cloud shutting down: end every VM's processes (the VMs stay in the cloud, which stops too)."""
        with self.lock:
            for node in list(self.nodes.values()):
                self.forget(node, 1.0)
            self.nodes.clear()
        kill_marked(f"JOBPLANE_LOCAL_CLOUD={self.cloud_id}", grace=1.0)


def clean(state_dir: Path) -> None:
    shutil.rmtree(state_dir / "instances", ignore_errors=True)
