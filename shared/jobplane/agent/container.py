"""The job's phases in its container (the spec's `container:`), with the VM's container runtime.

A phase is `<runtime> run` in a session of its own, as a shell command would be; what differs is whom a signal
reaches. The runtime's monitor (conmon, containerd-shim) lives in a session of its own and would outlive a
signal to the client's group, so the job's processes are the container's own, found by the marker variable
each of them carries (jobplane.model.containers.MARKER), in a PID namespace other than the agent's: they are frozen,
signalled and killed exactly as a job's process group is without a container. The container's init (PID 1
inside) is left to pass its child's exit on; the client exits when the container does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from jobplane.agent.output import OutputLog
from jobplane.agent.process import UserProcess, marked_pids, wait_stopped
from jobplane.model import containers

REMOVE_TIMEOUT_S = 30.0


def find_runtime(path: str | None = None) -> str | None:
    """podman, else docker, on the VM's PATH."""
    for name in containers.RUNTIMES:
        if found := shutil.which(name, path=path):
            return found
    return None


def container_pids(name: str, proc: Path = Path("/proc")) -> list[int]:
    """The processes of container `name`, its init excepted: they carry the marker and live in another PID
    namespace than ours (the runtime's client and monitor carry the marker too, in ours)."""
    try:
        ours = os.readlink(proc / "self" / "ns" / "pid")
    except OSError:
        return []
    found = []
    for pid in marked_pids(f"{containers.MARKER}={name}", proc):
        try:
            if os.readlink(proc / str(pid) / "ns" / "pid") == ours:
                continue
            nspid = next(line for line in (proc / str(pid) / "status").read_text().splitlines()
                         if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue  # gone, or not ours to read
        if nspid.split()[-1] != "1":
            found.append(pid)
    return found


class ContainerProcess(UserProcess):
    """One phase run in the container `name` (the argv from containers.run_argv)."""

    what = "the container's processes"

    def __init__(self, argv: list[str], name: str, runtime: str, cwd: Path, env: dict[str, str],
                 out: OutputLog) -> None:
        self.name, self.runtime = name, runtime
        super().__init__(argv, cwd, {**env, containers.MARKER: name}, out)

    def _send(self, sig: signal.Signals) -> None:
        pids = container_pids(self.name)
        if not pids:  # not started yet (or already gone): the client passes a signal on, or gives up starting
            super()._send(sig)
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _wait_stopped(self, timeout: float = 2.0) -> bool:
        return wait_stopped(None, timeout, pids=lambda: container_pids(self.name))

    def members(self) -> list[int] | None:
        return container_pids(self.name)

    def _finish(self) -> None:
        for pid in container_pids(self.name):  # leftovers, as a group kill ends a shell's background children
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        super()._finish()
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # --rm normally did it
            subprocess.run(containers.remove_argv(self.runtime, self.name), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=REMOVE_TIMEOUT_S,
                           check=False)


@dataclass(frozen=True)
class Container:
    """How this node runs the job's phases in its container."""

    runtime: str
    image: str
    name: str
    options: tuple[str, ...]
    mounts: tuple[Path, ...]
    gpus: int
    path: str  # the VM's PATH, where the runtime's own helpers are

    def phase(self, command: str, workdir: Path, env: dict[str, str], out: OutputLog) -> ContainerProcess:
        names = containers.env_names(env)
        argv = containers.run_argv(self.runtime, image=self.image, name=self.name, command=command, workdir=workdir,
                                   mounts=self.mounts, env_names=names, options=self.options, gpus=self.gpus)
        client_env = {**{k: env[k] for k in names}, "PATH": self.path}
        return ContainerProcess(argv, self.name, self.runtime, workdir, client_env, out)
