"""The GCE instance runner: every managed VM in the Compute fake becomes a local process tree (jobplane.local.
runner) that runs its real startup-script with its own fake metadata server, and the runner does what GCE
does to a VM:

- a guest power-off (the agent's, or the boot script's `shutdown -h +N`): the shutdown-script runs, then the
  VM is TERMINATED (GCE keeps a stopped VM, and its disk, until someone deletes it);
- a delete or stop through the API (the check, `cancel --force`): the shutdown-script runs, then the
  processes end;
- scheduling.maxRunDuration, GCE's own uptime cap: at creation + maxRunDuration the shutdown-script runs and
  the VM is deleted (or stopped, as its instanceTerminationAction says);
- a Spot preemption (`jobplane local preempt`): instance/preempted turns TRUE, the shutdown-script runs, and
  after the grace (GCE gives about 30 s) the VM is deleted and a compute.instances.preempted operation
  recorded.
Each shutdown-script gets a budget; the runner never waits on it, it checks back every tick. On this machine a
VM sees only its own processes through `pgrep` (a shim first on its PATH), as it would on its own machine: the
shutdown-script's pgrep must not find another VM's agent.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from jobplane.clouds.base import TAG_JOB_ID, TAG_MANAGED, TAG_RANK
from jobplane.clouds.gce_metadata import gce_key
from jobplane.local import rootfs
from jobplane.local.fake_compute import FakeComputeServer
from jobplane.local.gce_metadata_server import FakeGceMetadataServer
from jobplane.local.google_identity import VM_SERVICE_ACCOUNT, LocalIdentityIssuer
from jobplane.local.runner import KILL_GRACE, MARKER, InstanceRunner, Node

log = logging.getLogger("local-cloud")

SHUTDOWN_BUDGET_S = 30.0  # what the runner gives a shutdown-script on a stop, delete or maxRunDuration
ALIVE = ("PROVISIONING", "STAGING", "RUNNING")
# pgrep on a local VM: the processes carrying this VM's marker only. -f, -o, -n and -x, as procps means them.
PGREP = f'''#!{sys.executable} -I
"""pgrep on a jobplane local-cloud VM: only this VM's processes, as on its own machine."""
import os, re, sys
marker = ("{MARKER}=" + os.environ.get("{MARKER}", "")).encode()
flags, pattern, args = set(), None, sys.argv[1:]
while args:
    arg = args.pop(0)
    if arg == "--" and args:
        pattern = args.pop(0)
    elif arg.startswith("-") and len(arg) > 1 and pattern is None and set(arg[1:]) <= set("fonx"):
        flags |= set(arg[1:])
    elif pattern is None and not arg.startswith("-"):
        pattern = arg
    else:
        sys.exit("pgrep (local VM): unsupported argument " + arg)
if pattern is None:
    sys.exit("pgrep (local VM): no pattern")
found = []
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
    try:
        if marker not in open("/proc/%s/environ" % pid, "rb").read().split(b"\\0"):
            continue
        cmd = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\\0", b" ").decode(errors="replace").strip()
        stat = open("/proc/%s/stat" % pid).read()
    except OSError:
        continue
    name, started = stat[stat.index("(") + 1:stat.rindex(")")], int(stat[stat.rindex(")") + 2:].split()[19])
    subject = cmd if "f" in flags else name
    if (re.fullmatch if "x" in flags else re.search)(pattern, subject):
        found.append((started, int(pid)))
found.sort()
found = found[:1] if "o" in flags else found[-1:] if "n" in flags else found
print("\\n".join(str(pid) for _, pid in found))
sys.exit(0 if found else 1)
'''

Event = Callable[[str, str, str], None]  # (what: running|preempted|capped|stopped|deleted, instance id, detail)


@dataclass
class Ending:
    """A VM going away: its shutdown-script has until deadline, then its processes end and then() runs."""

    script: subprocess.Popen[bytes] | None
    deadline: float
    then: Callable[[], None]
    state: str  # what the VM is afterwards: stopped | deleted
    hold: bool = False  # wait out the deadline even when the script is done (a preemption's grace)


@dataclass
class Vm:
    """What GCE keeps about one booted VM beyond its processes."""

    shutdown_script: str
    cap_at: float | None  # creation + maxRunDuration, epoch seconds
    ending: Ending | None = None


def _service_account(resource: dict[str, Any]) -> str:
    """The VM's service account as its identity tokens name it (GCE's "default" is the local VMs' account)."""
    email = str((resource.get("serviceAccounts") or [{}])[0].get("email") or "default")
    return VM_SERVICE_ACCOUNT if email == "default" else email


def vm_id(resource: dict[str, Any]) -> str:
    return f"{resource['zone'].rsplit('/', 1)[-1]}/{resource['name']}"


def metadata_items(resource: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i.get("value", "") for i in resource.get("metadata", {}).get("items", [])}


def max_run_deadline(resource: dict[str, Any]) -> float | None:
    seconds = int(resource.get("scheduling", {}).get("maxRunDuration", {}).get("seconds", 0) or 0)
    if not seconds:
        return None
    return datetime.fromisoformat(resource["creationTimestamp"].replace("Z", "+00:00")).timestamp() + seconds


class GceRunner(InstanceRunner):
    """Call sync() every tick; preempt() and kill() come from the control endpoint."""

    # what a VM inside an image sees of this machine's environment: where GCS is, the package index
    vm_env_prefixes = ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "UV_", "PIP_")

    def __init__(self, compute: FakeComputeServer, state_dir: Path, instance_env: dict[str, str], cloud_id: str,
                 on_event: Event, images: Mapping[str, Path] | None = None,
                 shutdown_budget: float = SHUTDOWN_BUDGET_S, issuer: LocalIdentityIssuer | None = None) -> None:
        super().__init__(state_dir, instance_env, cloud_id, images, shims={"pgrep": PGREP})
        self.compute = compute
        self.on_event = on_event
        self.shutdown_budget = shutdown_budget
        self.issuer = issuer  # signs each VM's identity tokens (None: its metadata server has none)
        self.vms: dict[str, Vm] = {}

    # ---- the tick ------------------------------------------------------------------------------------
    def sync(self) -> None:
        with self.lock:
            seen = {vm_id(r): r for r in self.compute.instances()
                    if r.get("labels", {}).get(gce_key(TAG_MANAGED)) == "true"}
            for iid, res in seen.items():
                if res["status"] in ALIVE and iid not in self.nodes and iid not in self.done:
                    self._boot(iid, res)
            for iid, node in list(self.nodes.items()):
                vm, now = self.vms[iid], seen.get(iid)
                if vm.ending is not None:
                    self._continue(node, vm.ending)
                elif now is None:  # deleted through the API
                    self._shut_down(node, "deleted", "deleted")
                elif now["status"] not in ALIVE:  # stopped through the API
                    self._shut_down(node, "stopped", "stopped")
                else:
                    self._watch(node, vm)

    def _boot(self, iid: str, res: dict[str, Any]) -> None:
        zone, name = iid.split("/", 1)
        labels, items = res.get("labels", {}), metadata_items(res)
        ip = res["networkInterfaces"][0].get("networkIP")
        rank_label = labels.get(gce_key(TAG_RANK), "")
        suffix = name.rsplit("-", 1)[-1]
        rank = int(rank_label) if rank_label.isdigit() else int(suffix) - 1 if suffix.isdigit() else 0
        disks = res.get("disks") or [{}]
        image = disks[0].get("initializeParams", {}).get("sourceImage", "")
        metadata = FakeGceMetadataServer(instance_id=res["id"], name=name, zone=zone, project=self.compute.project,
                                         attributes=items, ip=ip or "", machine_type=res["machineType"].rsplit("/")[-1],
                                         issuer=self.issuer, service_account=_service_account(res))
        metadata.start()
        node = self.add_node(iid, labels.get(gce_key(TAG_JOB_ID)), rank, image, metadata)
        self.vms[iid] = Vm(items.get("shutdown-script", ""), max_run_deadline(res))
        startup = items.get("startup-script", "")
        refused = self.refusal(node, [ip], startup + "\n" + self.vms[iid].shutdown_script)
        if refused:
            node.notes.append(f"refused: {refused}")
            self._finish(node, Ending(None, 0, partial(self.compute.end, iid), "deleted"))
            return
        self.on_event("running", iid, "")
        if not startup.strip():
            log.info("instance %s (%s) is up with no startup-script: idle", iid, node.job_id or "no job")
            return
        (node.share / "shutdown-script").write_text(self.vms[iid].shutdown_script)
        self.start(node, startup, {"GCE_METADATA_HOST": metadata.host})

    def _watch(self, node: Node, vm: Vm) -> None:
        self.read_power(node)
        now = time.time()
        if vm.cap_at is not None and vm.cap_at <= now and (node.halt_at is None or vm.cap_at <= node.halt_at):
            log.info("instance %s reached its maxRunDuration", node.id)
            self.on_event("capped", node.id, "maxRunDuration reached: GCE stops it")
            self._shut_down(node, "deleted", "maxRunDuration", partial(self.compute.end, node.id))
        elif node.halt_at is not None and node.halt_at <= now:
            log.info("instance %s powered off (%s)", node.id, node.halt_why)
            self._shut_down(node, "stopped", node.halt_why, partial(self.compute.power_off, node.id))

    # ---- going away -----------------------------------------------------------------------------------
    def _shut_down(self, node: Node, state: str, why: str, then: Callable[[], None] = lambda: None,
                   budget: float | None = None, hold: bool = False) -> None:
        """Start the VM's shutdown-script (GCE runs it on every stop and delete) and give it budget seconds."""
        vm = self.vms[node.id]
        script = None
        command = self._shutdown_command(node) if vm.shutdown_script.strip() and node.proc is not None else None
        if command is not None:
            script = subprocess.Popen(command, cwd=node.root, env=node.env if not node.image else None,
                                      stdin=subprocess.DEVNULL, stdout=node.console, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        log.info("instance %s going away (%s): shutdown-script %s", node.id, why,
                 f"pid {script.pid}" if script else "none")
        vm.ending = Ending(script, time.monotonic() + (self.shutdown_budget if budget is None else budget), then,
                           state, hold)
        self._continue(node, vm.ending)

    def _shutdown_command(self, node: Node) -> list[str] | None:
        if node.image is None:
            return ["bash", str(node.share / "shutdown-script")]
        if node.proc is None:
            return None
        return rootfs.enter(node.proc.pid, node.env, ["/bin/bash", f"{rootfs.SHARE}/shutdown-script"])

    def _continue(self, node: Node, ending: Ending) -> None:
        if node.proc is not None:  # reap the startup-script (the agent, where it exec'd it) as a VM's init would:
            node.proc.poll()       # the shutdown-script's `kill -0` takes a zombie for an agent still running
        running = ending.script is not None and ending.script.poll() is None
        if (running or ending.hold) and time.monotonic() < ending.deadline:
            return
        if running and ending.script is not None:
            log.info("instance %s: shutdown-script still running after its budget; ending it", node.id)
            with contextlib.suppress(ProcessLookupError):
                ending.script.kill()
            ending.script.wait(timeout=5)
        self._finish(node, ending)

    def _finish(self, node: Node, ending: Ending) -> None:
        killed = self.forget(node, KILL_GRACE)
        ending.then()
        self.vms.pop(node.id, None)
        state = "deleted" if self.compute.status(node.id) is None else ending.state  # the API may have been first
        self.on_event(state, node.id, "")
        log.info("instance %s %s (%d processes ended)", node.id, state, killed)

    # ---- control --------------------------------------------------------------------------------------
    def preempt(self, job_id: str, rank: int | None, grace: float) -> list[dict[str, Any]]:
        """GCE Spot preemption: instance/preempted turns TRUE and the shutdown-script runs at once; after grace
        the VM is deleted and the preemption recorded."""
        out = []
        with self.lock:
            for node in self.select(job_id, rank):
                vm = self.vms[node.id]
                if vm.ending is not None:
                    continue
                node.metadata.set_preempted()
                self.on_event("preempted", node.id, f"instance/preempted is TRUE; deleted in {grace:g}s")
                self._shut_down(node, "deleted", "Spot preemption", partial(self.compute.preempt, node.id),
                                budget=grace, hold=True)
                out.append({"instance_id": node.id, "rank": node.rank,
                            "notice": {"instance/preempted": "TRUE", "deleted in": f"{grace:g}s"}})
        return out

    def died(self, node: Node) -> None:
        """A host failure: with onHostMaintenance TERMINATE and no automatic restart the VM is TERMINATED."""
        self._finish(node, Ending(None, 0, partial(self.compute.power_off, node.id), "stopped"))
