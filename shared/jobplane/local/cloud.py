"""The local cloud behind `jobplane local up [--cloud aws|gcp]` (jobplane.local.up runs it): a cloud's API emulators,
the instance runner, the trigger loop and the control endpoint. The same shape on both clouds; what differs is in
jobplane.local.aws (moto's server, EC2 instances, Lambda handlers) and jobplane.local.gcp (the GCS and Compute Engine
fakes, GCE VMs, Cloud Functions through functions-framework).

Everything lives under a state directory (default .jobplane/): the state file a second shell and
`jobplane local ...` read, env.sh with the exports, the power-command shims, one scratch root per VM, and
functions.log (what the functions log and their metrics, and the runner's details). The terminal gets one
short line per thing that happens (see jobplane.local.console). VMs get addresses inside 127.0.0.0/8: every
address a job sees is on this machine. On exit every VM process, server and port is gone.

Like a fresh deployment, the registry gets the agent bundle (this machine's variant) and a policy without
images of its own, so jobs boot through the image aliases: Ubuntu's stand for this machine (the local cloud
has no Ubuntu), and Debian's for the stock Debian 12 image when it is built (jobplane.local.rootfs). VMs
install requirements.txt from a package index on loopback (jobplane.local.package_index), never from PyPI, and
pull container images from a registry on loopback (jobplane.local.oci_registry; its jobplane/debian:12 reference
is printed at start, and is `oci_image` in the state file and in `jobplane local status`), never from a public one.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import yaml

from jobplane.boot import agent_bundle, bundling
from jobplane.clouds.faults import VISIBILITY_S, Faults
from jobplane.local import baked_agent, cache_dir
from jobplane.local.changes import Look, Watch
from jobplane.local.console import Console, notified_line
from jobplane.local.control import STATE_FILE, ControlServer
from jobplane.local.triggers import Functions, TriggerLoop
from jobplane.local.waiting import WaitTimeout, wait_for
from jobplane.model import keys
from jobplane.model.policy import parse_policy
from jobplane.store.registry import Registry

log = logging.getLogger("local-cloud")  # not under "jobplane": the functions' loggers own that

FUNCTIONS_LOG = "functions.log"
BUCKET = "jobplane-local"
# Short timeouts, so the demo and scenario tests see every rule fire in seconds rather than minutes.
LOCAL_POLICY = """\
# Policy of the local cloud (`jobplane local up`): demo-sized timeouts.
allowed_instance_types: ["*"]
max_nodes_per_job: 4
default_max_runtime: 10m
max_runtime_ceiling: 30m
default_max_wait: 10m
default_stall_timeout: 60s
default_boot_timeout: 60s
max_active_instances_per_owner: 8
{placement}
safety:
  orphan_grace: 20s
  stop_grace: 30s
  max_terminations_per_run: 10
"""


FAULTS_POLICY: dict[str, Any] = {"safety": {"orphan_grace": f"{int(VISIBILITY_S * 2)}s"}}


def local_policy(placement: str, overrides: Mapping[str, Any] | None = None) -> str:
    """The local cloud's policy: LOCAL_POLICY with the cloud's placement, and the fields of `local up --policy FILE`
    over it (a value it sets wins; a section it names, such as `safety:`, is merged field by field). A bad field
    raises SpecError naming it."""
    text = LOCAL_POLICY.format(placement=placement)
    if overrides:
        doc = merged(yaml.safe_load(text), overrides)
        text = (text.splitlines(keepends=True)[0] + "# with the fields of `jobplane local up --policy`\n"
                + yaml.safe_dump(doc, sort_keys=False))
    parse_policy(text)
    return text


def merged(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """A policy document with over's fields over base's: a value over's names wins; a section both name (such as
    `safety:`) is merged field by field."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        out[key] = merged(below, value) if isinstance(value, dict) and isinstance(below, dict) else value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortInUse(RuntimeError):
    """A port the local cloud was told to serve on is taken (by another local cloud?)."""

    def __init__(self, port: int, option: str = "--port") -> None:
        super().__init__(f"port {port} on 127.0.0.1 is in use (by another local cloud?): choose another {option}, "
                         f"or {option} 0 for a free one")
        self.port = port


def listening_socket(port: int, option: str = "--port") -> socket.socket:
    """A socket listening on 127.0.0.1:port (0: a free one), to hand to the server that will answer there. From
    here on the port is this process's and that server's: whatever answers on it is ours, never another's. A
    port some other socket listens on raises PortInUse naming it and the option that chose it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port left in TIME_WAIT by our last run is free
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(port, option) from None
        raise
    return sock


class ServiceProcess:
    """An API emulator in its own process (moto's server, the GCS fake): the runner, the functions and the VMs
    share no GIL with it. It serves on a socket this process binds and hands it (`--fd`), so a busy port fails
    the start naming it, and the server that answers is the one we started."""

    def __init__(self, module: str, port: int = 0, *args: str) -> None:
        self.module, self.args = module, args
        self.port = port  # 0: a free one, chosen at start
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_path: Path, env: dict[str, str] | None = None, timeout: float = 30) -> ServiceProcess:
        with listening_socket(self.port) as sock, log_path.open("ab") as out:
            self.port = sock.getsockname()[1]
            fd = sock.fileno()
            command = [sys.executable, "-m", self.module, "-H", "127.0.0.1", "-p", str(self.port), "--fd", str(fd),
                       *self.args]
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **(env or {})}, pass_fds=(fd,))
        # closed here: the child holds the only copy, so the port is free again the moment it exits
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def answers() -> bool:
            try:
                opener.open(f"{self.url}/", timeout=1).close()
            except urllib.error.HTTPError:
                pass  # an error page is an answer
            except OSError:
                return False
            return True

        proc = self.proc
        try:
            wait_for(f"{self.module} on port {self.port}", answers, timeout, 0.1,
                     abort=lambda: None if proc.poll() is None else f"it exited {proc.returncode}")
        except WaitTimeout as exc:
            self.stop()
            raise RuntimeError(f"{self.module} did not start ({exc}); see {log_path}") from None
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()



def team(owner: object) -> str:
    """An owner name a member's identity may be made for (keys.LABEL_KEY); ValueError naming it otherwise."""
    if not isinstance(owner, str) or not re.match(keys.LABEL_KEY, owner):
        raise ValueError(f"owner: {owner!r} is not an owner (a lowercase letter, then up to 62 of a-z 0-9 _ -)")
    return owner

class LocalCloud:
    """The shape both local clouds share; a subclass provides its cloud (see the abstract methods below)."""

    cloud = ""
    hidden_env: tuple[str, ...] = ()  # never a VM's: the other cloud's variables, and those only the functions use
    # The emulators' areas (jobplane.local.changes) whose change may change what the runner's sync or notifications()
    # would find; none: they ask every tick
    instance_areas: tuple[str, ...] = ()
    notice_areas: tuple[str, ...] = ()

    def __init__(self, state_dir: Path, port: int = 0, tick: float = 1.0, bucket: str = BUCKET,
                 schedule: float | None = None, policy: Mapping[str, Any] | None = None,
                 baked_agent: bool = False, faults: Faults | None = None) -> None:
        """policy: fields over the local policy's (`local up --policy FILE`), checked by local_policy. baked_agent:
        the VMs' images hold the agent already (`local up --baked-agent`, jobplane.local.baked_agent). faults: the
        cloud's APIs fail on demand (`local up --faults RATE`, jobplane.local.api_faults)."""
        self.state_dir = state_dir.resolve()
        self.faults = faults
        # a rank is lost once missing from listings past the orphan grace: longer than a new VM's lag in them
        self.policy = merged(FAULTS_POLICY, dict(policy or {})) if faults else dict(policy or {})
        self.baked_agent = baked_agent
        self.port = port
        self.tick = tick
        self.schedule = schedule if schedule is not None else max(tick, 2.0)
        self.bucket = bucket
        self.cloud_id = secrets.token_hex(6)
        self.stopping = threading.Event()
        self.runner: Any = None
        self.functions: Functions | None = None
        self.control: ControlServer | None = None
        self.index: Any = None
        self.oci_registry: Any = None  # a LocalRegistry, once its image is built
        terminal = sys.stdout  # not whatever sys.stdout is when a thread prints: invocations redirect it
        self.console = Console(self._record, write=lambda text: print(text, file=terminal, flush=True))
        self.reg: Registry | None = None
        self.log_stream: IO[str] | None = None
        self.watch = Watch()  # a subclass gives it its emulators' counts once they serve

    # ---- per cloud ------------------------------------------------------------------------------------
    @property
    def exports(self) -> dict[str, str]:
        """What a second shell (the CLI) and the functions need to find the registry and the cloud."""
        raise NotImplementedError

    def start_services(self) -> None:
        """Start the cloud's API emulators."""
        raise NotImplementedError

    def stop_services(self) -> None:
        raise NotImplementedError

    def services(self) -> dict[str, int | None]:
        """Pids of the emulator processes, for the state file (and the demo's check that none is left)."""
        raise NotImplementedError

    def provision(self) -> tuple[Registry, str, dict[str, Path]]:
        """Create the bucket; return the registry, the policy's placement section and image -> root fs."""
        raise NotImplementedError

    def make_functions(self, log_stream: IO[str]) -> Functions:
        raise NotImplementedError

    def notifications(self) -> list[dict[str, Any]]:
        """The job notices the deployment's notification topic received since the last call, oldest first."""
        raise NotImplementedError

    def make_runner(self, instance_env: dict[str, str], images: dict[str, Path]) -> Any:
        raise NotImplementedError

    def instance_by_hand(self, managed: bool, job_id: str | None, attempt: int | None, user_data: str) -> str:
        """A VM started the way a user (not the launcher) would; returns its id."""
        raise NotImplementedError

    def member_exports(self, owner: str) -> dict[str, str]:
        """What a second shell needs to act as a member of `owner`'s team, under the deployment's own grants to one."""
        raise NotImplementedError

    # ---- the shared shape -----------------------------------------------------------------------------
    def start(self) -> LocalCloud:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if (self.state_dir / STATE_FILE).exists():
            raise RuntimeError(f"a local cloud may already be running ({self.state_dir / STATE_FILE} exists); "
                               "stop it, or remove the file if it is stale")
        try:
            self.start_services()
            self._provision()
        except BaseException:
            self.stop()
            raise
        return self

    def _provision(self) -> None:
        from jobplane.local.package_index import PackageIndex
        from jobplane.local.runner import clean

        # This process plays the cloud's functions: they read the registry and the cloud from the environment.
        os.environ.update({**self.exports, "JOBPLANE_ROOT": ""})
        reg, placement, images = self.provision()
        self.reg = reg
        bundle, variant = publish_agent(reg, self.cloud)
        reg.put(keys.POLICY, local_policy(placement, self.policy).encode(), "application/yaml")
        clean(self.state_dir)
        self.index = PackageIndex()
        self.index.start()
        self._start_oci_registry()
        self.log_stream = (self.state_dir / FUNCTIONS_LOG).open("a", buffering=1)
        functions = self.functions = self.make_functions(self.log_stream)
        self.triggers = TriggerLoop(reg, functions, self.schedule, self.bucket)
        instance_env = {k: v for k, v in os.environ.items()
                        if not k.startswith(("JOBPLANE_", "POWERTOOLS_", *self.hidden_env))}
        instance_env.update(UV_INDEX_URL=self.index.url, PIP_INDEX_URL=self.index.url, UV_PYTHON_DOWNLOADS="never")
        self.runner = self.make_runner(instance_env, images)
        if self.baked_agent:
            self.runner.baked_agent = baked_agent.unpacked(bundle, variant.sha256, cache_dir())
        self.control = ControlServer({
            "preempt": lambda b: self.runner.preempt(b["job_id"], b.get("rank"), float(b.get("grace", 10))),
            "kill": lambda b: self.runner.kill(b["job_id"], b.get("rank")),
            "shell": lambda b: self.runner.shell(str(b["instance_id"])),
            "instances": lambda b: {"instance_id": self.instance_by_hand(
                bool(b.get("managed", True)), b.get("job_id"), b.get("attempt"), b.get("user_data", ""))},
            "pause": lambda b: {"paused": functions.pause(str(b["function"]), bool(b.get("paused", True)))},
            "member": lambda b: self.member_exports(team(b.get("owner"))),
            "down": lambda b: self._down(),
            "status": lambda b: {"cloud": self.cloud, "oci_image": self.oci_image,
                                 "instances": self.runner.status(),
                                 "invocations": functions.invocations, "errors": functions.errors,
                                 "paused": sorted(functions.paused), "missing": sorted(functions.missing)},
        }).start()
        self._write_state()

    def _start_oci_registry(self) -> None:
        from jobplane.local import oci_registry

        if problem := oci_registry.image_problem():
            log.warning("no container registry in this local cloud: %s", problem)
            return
        self.oci_registry = oci_registry.LocalRegistry()
        self.oci_registry.start()

    @property
    def oci_image(self) -> str | None:
        """The reference a `container:` job names for the image the cloud's registry serves; its port, so the
        reference, changes with each start."""
        return self.oci_registry.reference() if self.oci_registry else None

    def _record(self, job_id: str) -> Any:
        from jobplane.store.registry import JobNotFound

        try:
            return self.reg.job(job_id) if self.reg is not None else None
        except JobNotFound:
            return None

    def _write_state(self) -> None:
        state = {"pid": os.getpid(), "cloud": self.cloud, "cloud_id": self.cloud_id,
                 "control_url": self.control.url if self.control else None, "services": self.services(),
                 "oci_image": self.oci_image,
                 **self.exports}
        # and where the local cloud is, for the commands that reach its VMs (`jobplane ssh`, `jobplane local`)
        shell = {**self.exports, "JOBPLANE_LOCAL_STATE": str(self.state_dir.resolve())}
        (self.state_dir / "env.sh").write_text("".join(f"export {k}={v}\n" for k, v in shell.items()))
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_dir / STATE_FILE)

    def step(self) -> None:
        """One tick: VMs follow the cloud, then events and schedules fire; notifications reach the console. What
        the emulators' counts say has not changed since the last tick is not asked again (an idle cloud lists
        nothing); a VM running is watched every tick."""
        look = self.watch.look()
        if self.runner.nodes or self._changed(look, self.instance_areas):
            self.runner.sync()
        self.triggers.tick(look, busy=bool(self.runner.nodes))
        if self._changed(look, self.notice_areas):
            for data in self.notifications():
                self.console.emit(notified_line(data))
        look.done()

    @staticmethod
    def _changed(look: Look, areas: tuple[str, ...]) -> bool:
        return not areas or any(look.changed(area) for area in areas)

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.step()
            except Exception:
                log.exception("local cloud tick failed; retrying next tick")
            self.stopping.wait(max(0.0, self.tick - (time.monotonic() - started)))

    def _down(self) -> dict[str, bool]:
        """`jobplane local down`: the run loop ends, as at Ctrl-C, and up() stops everything."""
        self.stopping.set()
        return {"stopping": True}

    def stop(self) -> None:
        self.stopping.set()
        if self.control is not None:
            self.control.stop()
        if self.runner is not None:
            self.runner.stop_all()
        if self.index is not None:
            self.index.stop()
        if self.oci_registry is not None:
            self.oci_registry.stop()
        self.stop_services()
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        if self.log_stream is not None:
            self.log_stream.close()


def publish_agent(reg: Registry, cloud: str) -> tuple[Path, agent_bundle.Variant]:
    """This machine's agent bundle for the cloud and its manifest, where a deployment puts them; returns the
    bundle's file and its manifest entry."""
    path, variant = bundling.local_variant(cloud, cache_dir())
    reg.put(keys.agent_file(variant.name), path.read_bytes())
    reg.put(keys.agent_file(agent_bundle.MANIFEST), agent_bundle.manifest([variant]))
    return path, variant
