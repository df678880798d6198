"""The user's command: bash in its own process group, output pumped into an OutputLog."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jobplane.agent.output import OutputLog


def exit_code(returncode: int) -> int:
    """Popen's -N (killed by signal N) as a shell reports it: 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def marked_pids(marker: str, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the processes we can read whose environment holds `marker` (NAME=value), this one excepted: a
    variable every descendant inherits finds them even after they left the session."""
    needle = marker.encode()
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = (proc / entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def _stat(pid: str | int) -> list[str] | None:
    """state ppid pgrp ... of a process (comm may hold spaces), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def wait_stopped(pgid: int | None, timeout: float = 2.0, pids: Callable[[], list[int]] | None = None) -> bool:
    """Wait until every process of the group (or every one `pids` lists) has stopped (a SIGSTOP takes effect
    when each next runs, and a write in progress finishes first); False if one still runs after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if pids is not None:
            candidates: list[str | int] = list(pids())
        else:
            candidates = [e for e in os.listdir("/proc") if e.isdigit()] if os.path.isdir("/proc/self") else []
        running = False
        for entry in candidates:
            fields = _stat(entry)
            if fields and (pids is not None or int(fields[2]) == pgid) and fields[0] not in "TtZXx":
                running = True
                break
        if not running:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


class UserProcess:
    """argv, or a shell command (bash -c), in a session of its own."""

    what = "the process group"  # whom its signals reach, as the job's log says

    def __init__(self, command: str | list[str], cwd: Path, env: dict[str, str], out: OutputLog) -> None:
        # A new session makes the shell a process-group leader: signals reach everything it started.
        argv = ["bash", "-c", command] if isinstance(command, str) else command
        self._proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self._pump = threading.Thread(target=self._read, args=(out,), name="output-pump", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _read(self, out: OutputLog) -> None:
        assert self._proc.stdout is not None
        for line in iter(self._proc.stdout.readline, b""):
            out.user(line)

    def poll(self) -> int | None:
        code = self._proc.poll()
        if code is None:
            return None
        self._finish()
        return exit_code(code)

    def terminate(self, grace: float, frozen: Callable[[], None] = lambda: None) -> int:
        """SIGTERM the group, wait up to grace seconds, then SIGKILL it; returns the exit code. Before each
        signal the group is frozen (SIGSTOP) and frozen() called: what it sees open is what the signal cuts."""
        self._signal(signal.SIGTERM, frozen)
        try:
            code = self._proc.wait(timeout=max(0.0, grace))
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL, frozen)
            code = self._proc.wait()
        self._finish()
        return exit_code(code)

    def _signal(self, sig: signal.Signals, frozen: Callable[[], None] | None = None) -> None:
        if frozen is None:
            self._send(sig)
            return
        self._send(signal.SIGSTOP)
        try:
            self._wait_stopped()
            frozen()
        finally:  # a stopped process only acts on SIGTERM once continued; SIGKILL ends it either way
            self._send(sig)
            self._send(signal.SIGCONT)

    def _send(self, sig: signal.Signals) -> None:
        """Signal the job's processes: the session's group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
            os.killpg(self._proc.pid, sig)

    def _wait_stopped(self) -> None:
        wait_stopped(self._proc.pid)

    def _finish(self) -> None:
        # Leftover background children would hold the pipe open and outlive the job: kill the group,
        # then let the pump drain what is left.
        self._signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        self._pump.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._proc.stdout is not None and not self._pump.is_alive():
            self._proc.stdout.close()
