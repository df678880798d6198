"""The local cloud's control endpoint (loopback HTTP, JSON): how `jobplane local ...` reaches a running
local cloud to do what only a cloud provider can (preempt a Spot VM, kill a VM, start a VM by hand).

Its URL is in the state file <state dir>/local.json, written by `local up` and removed on exit.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

Route = Callable[[dict[str, Any]], Any]
STATE_FILE = "local.json"


def state_dir(explicit: str | Path | None = None) -> Path:
    return Path(explicit or os.environ.get("JOBPLANE_LOCAL_STATE") or ".jobplane")


class ControlError(Exception):
    pass


class ControlServer:
    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(routes))
        self.server.daemon_threads = True
        self.thread = Thread(target=self.server.serve_forever, name="local-control", daemon=True,
                             kwargs={"poll_interval": 0.2})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> ControlServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def _handler(routes: dict[str, Route]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            route = routes.get(self.path.strip("/"))
            if route is None:
                return self._reply(404, {"error": f"no such control action {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                self._reply(200, route(body))
            except (ValueError, KeyError, LookupError) as exc:
                self._reply(400, {"error": str(exc)})
            except Exception as exc:
                self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def read_state(directory: Path) -> dict[str, Any]:
    path = directory / STATE_FILE
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise ControlError(f"no local cloud running ({path} not found): start one with `jobplane local up`") from None


def call(directory: Path, action: str, body: dict[str, Any], timeout: float = 60) -> Any:
    """POST to the running local cloud's control endpoint; ControlError with its message on failure."""
    url = read_state(directory)["control_url"] + "/" + action
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raise ControlError(json.loads(err.read() or b"{}").get("error", f"HTTP {err.code}")) from None
    except (urllib.error.URLError, OSError) as err:
        raise ControlError(f"local cloud at {url} does not answer ({err}): is `jobplane local up` running?") from None
