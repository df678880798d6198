"""The dashboard beside `jobplane local up`: once the local cloud has written its state file, `jobplane ui` runs
as a child process over its registry (the exports a second shell would source), and its URL is printed and kept
in the state directory (UI_URL_FILE) for `make demo` to point at. Its port is bound here at once and handed to
the child, so a busy one is said at start, and the URL printed is never another local cloud's dashboard."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from jobplane.local.cloud import PortInUse, listening_socket
from jobplane.local.control import STATE_FILE

UI_URL_FILE = "ui-url"


def ui_url(state_dir: Path) -> str | None:
    """The dashboard's URL of the local cloud in state_dir, if it started one."""
    try:
        return (state_dir / UI_URL_FILE).read_text().strip() or None
    except OSError:
        return None


class Beside:
    """`jobplane ui --port PORT` started in a thread once the local cloud in state_dir (this process's) is up."""

    def __init__(self, state_dir: Path, port: int, environment: Mapping[str, str], timeout: float = 120) -> None:
        """environment: the process's (the entry point reads it), to which the local cloud's exports are added."""
        self.state_dir, self.timeout = state_dir, timeout
        self.environment = dict(environment)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        (state_dir / UI_URL_FILE).unlink(missing_ok=True)
        self.thread = threading.Thread(target=self._run, name="jobplane-ui", daemon=True)
        self.sock: socket.socket | None = None
        try:
            self.sock = listening_socket(port, "--ui-port")
        except PortInUse as exc:
            print(f"dashboard: not started: {exc}", flush=True)
            return
        self.thread.start()

    def _state(self) -> dict[str, object] | None:
        try:
            state = json.loads((self.state_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) and state.get("pid") == os.getpid() else None

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        state = self._state()
        while state is None:
            if self.stopping.wait(0.2) or time.monotonic() > deadline:
                return
            state = self._state()
        try:
            import starlette  # noqa: F401  (the ui extra)
        except ImportError:
            print("dashboard: not started (pip install 'jobplane[ui]' for `jobplane ui`)", flush=True)
            return
        assert self.sock is not None
        port, fd = self.sock.getsockname()[1], self.sock.fileno()
        env = {**self.environment, **{k: str(v) for k, v in state.items() if k.isupper()}}
        with self.sock, (self.state_dir / "ui.log").open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "jobplane.cli", "ui", "--port", str(port), "--fd",
                                          str(fd)], env=env, pass_fds=(fd,),
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        while not self.stopping.is_set() and self.proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        if self.proc.poll() is not None:
            print(f"dashboard: `jobplane ui --port {port}` exited {self.proc.returncode}; see "
                  f"{self.state_dir / 'ui.log'}", flush=True)
            return
        (self.state_dir / UI_URL_FILE).write_text(url + "\n")
        print(f"dashboard: {url}/", flush=True)

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(5)
        if self.sock is not None:
            self.sock.close()  # never handed over (the cloud did not start), or handed and closed already
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        (self.state_dir / UI_URL_FILE).unlink(missing_ok=True)
