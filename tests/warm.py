"""Warm interpreters: `python -m MODULE ARGS` and `python SCRIPT ARGS` as processes forked from one interpreter that
has already imported what they import, instead of a fresh interpreter each. A fresh one and the CLI's or the agent's
imports cost about 0.3 CPU seconds a process (`local up`'s, 0.7), and the suite starts a hundred of them (agents,
`jobplane` commands, local clouds, the benchmarks' smoke runs).

The child is a process of its own, as a fresh one would be: its argv, environment, working directory, standard
streams and session, `__main__` run by runpy, atexit and non-daemon threads at its exit, and its exit status (the
negated signal that killed it, as Popen reports one). The interpreter it forks from imports modules and nothing else (no
thread, no client, no environment read at import that a child's environment would change), and a command it cannot
run as a fresh interpreter would (another executable, interpreter flags, another PYTHONPATH) runs as a plain
subprocess. Signals reach the child through a pidfd the server took at the fork, so none reaches a recycled pid.
What differs: its command line in /proc (the server's), so nothing that finds a process by it (pgrep -f, a GCE
shutdown-script finding its agent) may start it here; and its parent (the server).

`warm` (a session fixture, tests/conftest.py) is one server per worker, stopped at the session's end.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

# What the suite's warm processes import: the CLI, the agent, the local AWS cloud and the AWS SDK (the GCP libraries
# stay out: a benchmark times their import)
PRELOAD = ("jobplane.cli", "jobplane.cli.jobs", "jobplane.agent.cli", "jobplane.agent.run", "jobplane.local.up",
           "jobplane.local.aws", "jobplane.local.ec2_runner", "boto3", "botocore.client")
# A fresh interpreter's environment decides these at its start; a child whose differ runs as a plain subprocess (a
# PYTHONPATH of directories the server's sys.path holds is moved to its front instead)
STARTUP_ENV = ("PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONIOENCODING", "PYTHONUTF8",
               "PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONHASHSEED")

SERVER = r'''
import gc, importlib, io, json, os, runpy, selectors, signal, socket, sys, threading

def serve(path, preload):
    for name in preload:
        importlib.import_module(name)
    assert threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1, "a thread: forking is unsafe"
    os.close(os.pidfd_open(os.getpid()))  # Linux 5.3's: without it, no server (the client spawns instead)
    gc.collect()
    gc.freeze()  # no collection in a child walks (and copies the pages of) what it was forked with: a third the cost
    with open(path + ".sys.path", "w") as out:
        json.dump(sys.path[1:], out)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # the client waits for the name: it appears listening
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    waiting = {}  # pid -> the connection its exit status goes to
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    for sock in (listener, conn, *waiting.values()):
                        os.close(sock.detach())  # detached: no socket object closes a number the program reuses
                    os.close(wake_r)
                    os.close(wake_w)
                    child(json.loads(msg), fds)  # raises SystemExit, or what the program raised, up and out
                pidfd = os.pidfd_open(pid)
                socket.send_fds(conn, [json.dumps({"pid": pid}).encode()], [pidfd])
                os.close(pidfd)
                for fd in fds:
                    os.close(fd)
                waiting[pid] = conn
            else:
                os.read(wake_r, 4096)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    conn = waiting.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                        except OSError:
                            pass
                        conn.close()

def child(req, fds):
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    os.setsid() if req["new_session"] else os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    def stream(fd, mode, **kw):
        raw = io.FileIO(fd, mode, closefd=False)
        return io.TextIOWrapper(raw if unbuffered and mode == "wb" else
                                (io.BufferedReader if mode == "rb" else io.BufferedWriter)(raw),
                                encoding=sys.stdout.encoding, write_through=unbuffered and mode == "wb", **kw)
    sys.stdin = sys.__stdin__ = stream(0, "rb", line_buffering=False)
    sys.stdout = sys.__stdout__ = stream(1, "wb", line_buffering=os.isatty(1))
    sys.stderr = sys.__stderr__ = stream(2, "wb", line_buffering=True, errors="backslashreplace")
    argv, first = req["argv"], req["pythonpath"]  # a fresh interpreter puts PYTHONPATH's first, after argv's
    path0 = os.getcwd() if argv[0] == "-m" else os.path.dirname(os.path.realpath(argv[0]))
    sys.path[:] = [path0, *first, *(p for p in sys.path[1:] if p not in first)]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)

serve(sys.argv[1], sys.argv[2:])
'''


class Process(Protocol):
    """What the suite asks of a process it started: Popen's, and Forked's."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class Forked:
    """A warm child, with the part of subprocess.Popen the suite uses."""

    def __init__(self, conn: socket.socket, pid: int, pidfd: int, stdout: IO[Any] | None,
                 stderr: IO[Any] | None, args: Sequence[str]) -> None:
        self._conn, self.pid, self._pidfd = conn, pid, pidfd
        self.stdout, self.stderr, self.stdin, self.args = stdout, stderr, None, list(args)
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._status(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def _status(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is None and select.select([self._conn], [], [], timeout)[0]:
                msg = self._conn.recv(4096)
                self.returncode = json.loads(msg)["exit"] if msg else -signal.SIGKILL  # a server gone: killed with it
                self._conn.close()
                os.close(self._pidfd)
            return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Both pipes read to their end (as Popen reads them, from threads), then the exit status."""
        assert input is None, "no stdin is piped to a warm child"
        out: dict[str, Any] = {}

        def read(name: str, pipe: IO[Any] | None) -> None:
            out[name] = pipe.read() if pipe is not None else None

        readers = [threading.Thread(target=read, args=(n, p), daemon=True)
                   for n, p in (("stdout", self.stdout), ("stderr", self.stderr))]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        return out["stdout"], out["stderr"]

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *_: object) -> None:
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        self.wait()


class Warm:
    """One warm server (SERVER) for this process's tests; popen() and run() fall back to subprocess's."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="jobplane-warm-"))
        self._path = self._dir / "server"
        self._env = dict(os.environ)
        self._sys_path: list[str] | None = None  # the server's, once it listens; None: every process spawns
        with (self._dir / "server.log").open("wb") as log:
            self._proc = subprocess.Popen([sys.executable, "-c", SERVER, str(self._path), *PRELOAD], env=self._env,
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while not self._path.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                warnings.warn(f"no warm interpreter (exit {self._proc.poll()}): every process starts fresh; "
                              f"{(self._dir / 'server.log').read_text()[-2000:]}", stacklevel=2)
                return
            time.sleep(0.02)
        self._sys_path = json.loads(Path(f"{self._path}.sys.path").read_text())

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def pythonpath(self, env: Mapping[str, str]) -> list[str] | None:
        """The child's PYTHONPATH entries, if the server's sys.path holds each (else None: it cannot run here)."""
        entries = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        return entries if self._sys_path is not None and all(p in self._sys_path for p in entries) else None

    def takes(self, args: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether a fresh interpreter would run args as the warm one does."""
        return (len(args) >= 2 and args[0] == sys.executable and ((args[1] == "-m" and len(args) >= 3)
                                                                   or not args[1].startswith("-"))
                and all(env.get(k) == self._env.get(k) for k in STARTUP_ENV) and self.pythonpath(env) is not None)

    def popen(self, args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
              stdin: Any = None, stdout: Any = None, stderr: Any = None, text: bool = False,
              start_new_session: bool = False) -> Forked | subprocess.Popen[Any]:
        env = dict(os.environ if env is None else env)
        if not self.takes(args, env):
            return subprocess.Popen(list(args), env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                                    text=text, start_new_session=start_new_session)
        opened: list[int] = []  # fds made here for the child, closed here once sent
        ours: dict[str, IO[Any]] = {}

        def fd(what: Any, std: int, name: str) -> int:
            if what is None:
                return std
            if what == subprocess.DEVNULL:
                opened.append(os.open(os.devnull, os.O_RDWR))
                return opened[-1]
            if what == subprocess.PIPE:
                r, w = os.pipe()
                ours[name] = open(r, encoding="utf-8") if text else open(r, "rb")  # noqa: SIM115
                opened.append(w)
                return w
            return what if isinstance(what, int) else int(what.fileno())

        fds = [fd(stdin, 0, "stdin"), fd(stdout, 1, "stdout")]
        fds.append(fds[1] if stderr == subprocess.STDOUT else fd(stderr, 2, "stderr"))
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(str(self._path))
            request = {"argv": list(args[1:]), "env": env, "cwd": str(cwd or os.getcwd()),
                       "new_session": start_new_session, "pythonpath": self.pythonpath(env)}
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
            msg, pidfds, _, _ = socket.recv_fds(conn, 4096, 1)
        except BaseException:
            conn.close()
            for pipe in ours.values():
                pipe.close()
            raise
        finally:
            for n in opened:
                os.close(n)
        return Forked(conn, json.loads(msg)["pid"], pidfds[0], ours.get("stdout"), ours.get("stderr"), args)

    def run(self, args: Sequence[str], *, capture_output: bool = False, text: bool = False,
            timeout: float | None = None, check: bool = False, env: Mapping[str, str] | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess[Any]:
        """subprocess.run's part the suite uses."""
        pipe = subprocess.PIPE if capture_output else None
        proc = self.popen(args, env=env, cwd=cwd, stdout=pipe, stderr=pipe, text=text)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        done = subprocess.CompletedProcess(list(args), proc.wait(), out, err)
        if check:
            done.check_returncode()
        return done
