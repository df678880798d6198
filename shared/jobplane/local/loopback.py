"""Loopback for the local cloud: the address check every VM's address passes before it boots, and the HTTP
plumbing the stdlib-based fakes share (a threaded server on loopback in a daemon thread)."""

from __future__ import annotations

import ipaddress
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Protocol, Self

# Linux routes all of 127.0.0.0/8 to lo: an address there handed to a local VM (MASTER_ADDR, SM_HOSTS, its
# metadata's IP) is an address of this machine, so nothing a job does reaches another one.
LOOPBACK_NET = ipaddress.ip_network("127.0.0.0/8")


def on_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address) in LOOPBACK_NET
    except ValueError:
        return False


def send_json(request: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    """Answer the request with body as JSON, as Google's APIs do."""
    data = json.dumps(body).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json; charset=UTF-8")
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client hung up mid-answer (pip and uv drop a download they already have): its business
        super().handle_error(request, client_address)


class Serving(Protocol):
    """What a stdlib or werkzeug server offers the thread that runs it."""

    server_address: Any

    def serve_forever(self, poll_interval: float = ...) -> None: ...

    def shutdown(self) -> None: ...

    def server_close(self) -> None: ...


class BackgroundServer:
    """A server on loopback run by a daemon thread; subclasses build it in make_server(). Use as a context
    manager or start()/stop()."""

    name = "fake"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host, self._port = host, port
        self._server: Serving | None = None
        self._thread: threading.Thread | None = None

    def make_server(self) -> Serving:
        raise NotImplementedError

    def start(self) -> None:
        if self._server is not None:
            return
        self._server = self.make_server()
        # a short poll: the default 0.5 s makes every stop() take half a second
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name=self.name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._server is not None

    def stop(self) -> None:
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=10)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def address(self) -> str:
        """host:port of the running server."""
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not running; call start() first")
        return f"{self._host}:{self._server.server_address[1]}"


class LoopbackServer(BackgroundServer):
    """A stdlib HTTP server whose subclasses answer requests in handle()."""

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    def make_server(self) -> Serving:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET  # handle() looks at request.command

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a line per request drowns test output

        server = _Server((self._host, self._port), Handler)
        server.daemon_threads = True
        return server
