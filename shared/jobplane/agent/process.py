"""The user's command: bash in its own process group, output pumped into an OutputLog.

The agent stops the job's processes (SIGSTOP) in two cases: just before each signal it sends, to see what that
signal will cut (`terminate`); and for a moment while the job runs, so the checkpoint keeper can copy a file the
job rewrites in place with nothing changing it (`paused`, bounded by a watchdog). The two never overlap: a pause
in effect ends first (its copy whole) and none starts while a signal's freeze is on. Between SIGTERM and SIGKILL
the job may still be saving (a handler, or SIGTERM ignored), so pauses go on; none starts once SIGKILL is due.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
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


def _stat(pid: str | int, task: str | None = None) -> list[str] | None:
    """state ppid pgrp ... of a process, or of one of its threads (comm may hold spaces); None once gone."""
    try:
        stat = Path(f"/proc/{pid}" + (f"/task/{task}/stat" if task else "/stat")).read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


_PF_IO_WORKER = 0x10  # an io_uring worker: the kernel's, in the process's thread group; it never stops


def _all_stopped(pid: str | int) -> bool:
    """Every thread of the process has stopped (or it is gone): a thread's write in progress finishes first, and
    /proc/<pid>/stat shows only the main thread's state."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return all((fields := _stat(pid, task)) is None or fields[0] in "TtZXx" or int(fields[6]) & _PF_IO_WORKER
               for task in tasks)


def group_pids(pgid: int) -> list[int] | None:
    """The processes of a process group, from /proc; None where there is none to read."""
    if not os.path.isdir("/proc/self"):
        return None
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and (f := _stat(e)) is not None and int(f[2]) == pgid]


def wait_stopped(pgid: int | None, timeout: float = 2.0, pids: Callable[[], list[int]] | None = None) -> bool:
    """Wait until every thread of every process of the group (or of every one `pids` lists) has stopped (a
    SIGSTOP takes effect when each next runs, and a write in progress finishes first); False if one still runs
    after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if pids is not None:
            candidates: list[str | int] = list(pids())
        else:
            candidates = [e for e in os.listdir("/proc") if e.isdigit()] if os.path.isdir("/proc/self") else []
        running = False
        for entry in candidates:
            fields = _stat(entry)
            if fields and (pids is not None or int(fields[2]) == pgid) and not _all_stopped(entry):
                running = True
                break
        if not running:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """This thread at the highest priority (nice -20) meanwhile, where the agent may (root: on a VM it is): while
    the job is frozen waiting for it (a copy, the watchdog's end of a pause), it should not wait its turn."""
    thread = threading.get_native_id()
    try:
        before = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, -20)
    except OSError:  # not allowed: at the priority it has
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, thread, before)


class Pause:
    """The job's processes stopped for a moment: `held()` while they still are. `end()` continues them (once); a
    watchdog calls it `limit` seconds after the stop whatever the holder is doing."""

    def __init__(self, send: Callable[[signal.Signals], None], limit: float) -> None:
        self._send, self.limit = send, limit
        self._lock = threading.Lock()
        self._stopped = self._ended = False
        self.ended = threading.Event()
        self.seconds = 0.0  # how long they were stopped, once ended
        self._watchdog = threading.Thread(target=self._watch, name="pause-watchdog", daemon=True)

    def start(self) -> bool:
        with self._lock:
            if self._ended:
                return False
            self._send(signal.SIGSTOP)
            self._stopped, self._since = True, time.monotonic()
        self._watchdog.start()
        return True

    def held(self) -> bool:
        return not self._ended

    def end(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            if self._stopped:
                self._send(signal.SIGCONT)
                self.seconds = time.monotonic() - self._since
        self.ended.set()

    def _watch(self) -> None:
        with urgent():  # on time on a busy machine too
            if not self.ended.wait(self.limit):
                self.end()


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
        self._pausing = threading.Lock()  # guards the three below
        self._signalling = False  # a signal's freeze is on: no pause starts
        self._killing = False  # SIGKILL is due: no pause any more, and what the job leaves is the final sync's
        self._pause: Pause | None = None  # the one in effect

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

    def running(self) -> bool:
        """Not ended, and no SIGKILL of the agent's due (what a SIGTERM may have cut, the keeper knows: it looked
        under the freeze before it)."""
        return not self._killing and self._alive()

    def _alive(self) -> bool:
        if self._proc.returncode is not None:
            return False
        try:  # WNOWAIT: asks without reaping, so the main thread's poll() still sees the exit
            return os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:  # reaped meanwhile
            return False

    @contextlib.contextmanager
    def paused(self, limit: float) -> Iterator[Pause | None]:
        """The job's processes stopped (SIGSTOP) for at most `limit` seconds, then continued, for a copy of a file
        that nothing may change meanwhile. None when they are ending (or ended), or did not all stop in time."""
        pause = Pause(self._send, limit)
        with self._pausing:
            free = not (self._signalling or self._killing) and self._pause is None
            if free:
                self._pause = pause
        try:
            ok = free and self._alive() and pause.start() and self._wait_stopped(limit) and self._alive()
            yield pause if ok and pause.held() else None
        finally:
            pause.end()
            if free:
                with self._pausing:
                    self._pause = None

    def terminate(self, grace: float, frozen: Callable[[], None] = lambda: None) -> int:
        """SIGTERM the group, wait up to grace seconds, then SIGKILL it; returns the exit code. Before each
        signal the group is frozen (SIGSTOP) and frozen() called: what it sees open is what the signal cuts.
        A pause in effect ends first (within its limit: its copy whole); none starts during a signal's freeze, nor
        once SIGKILL is due."""
        self._quiet()
        try:
            self._signal(signal.SIGTERM, frozen)
        finally:
            self._signalling = False  # the grace: the job may go on saving, and its copies with it
        try:
            code = self._proc.wait(timeout=max(0.0, grace))
        except subprocess.TimeoutExpired:
            self._quiet(killing=True)
            self._signal(signal.SIGKILL, frozen)
            code = self._proc.wait()
        self._finish()
        return exit_code(code)

    def _quiet(self, *, killing: bool = False) -> None:
        """No pause in effect (the one there is ends within its limit), and none starting, for a signal's freeze."""
        with self._pausing:
            self._signalling, self._killing, pause = True, self._killing or killing, self._pause
        if pause is not None:
            pause.ended.wait(pause.limit + 1.0)

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

    def _wait_stopped(self, timeout: float = 2.0) -> bool:
        return wait_stopped(self._proc.pid, timeout)

    def members(self) -> list[int] | None:
        """The processes its signals reach (the session's group); None where /proc cannot tell."""
        return group_pids(self._proc.pid)

    def _finish(self) -> None:
        # Leftover background children would hold the pipe open and outlive the job: kill the group,
        # then let the pump drain what is left.
        self._signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        self._pump.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._proc.stdout is not None and not self._pump.is_alive():
            self._proc.stdout.close()
