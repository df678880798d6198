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


def wait_stopped(pgid: int, timeout: float = 2.0) -> bool:
    """Wait until every process of the group has stopped (a SIGSTOP takes effect when each next runs, and a
    write in progress finishes first); False if one still runs after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        running = False
        for entry in os.listdir("/proc") if os.path.isdir("/proc/self") else []:
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp ...; comm may hold spaces
            if int(fields[2]) == pgid and fields[0] not in "TtZXx":
                running = True
                break
        if not running:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


class UserProcess:
    def __init__(self, command: str, cwd: Path, env: dict[str, str], out: OutputLog) -> None:
        # A new session makes the shell a process-group leader: signals reach everything it started.
        self._proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
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
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
            if frozen is None:
                os.killpg(self._proc.pid, sig)
                return
            os.killpg(self._proc.pid, signal.SIGSTOP)
            try:
                wait_stopped(self._proc.pid)
                frozen()
            finally:  # a stopped process only acts on SIGTERM once continued; SIGKILL ends it either way
                os.killpg(self._proc.pid, sig)
                os.killpg(self._proc.pid, signal.SIGCONT)

    def _finish(self) -> None:
        # Leftover background children would hold the pipe open and outlive the job: kill the group,
        # then let the pump drain what is left.
        self._signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        self._pump.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._proc.stdout is not None and not self._pump.is_alive():
            self._proc.stdout.close()
