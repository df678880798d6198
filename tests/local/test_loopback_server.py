"""The stdlib HTTP plumbing of the local fakes: a client hanging up mid-answer is not an error to print."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from jobplane.local.loopback import LoopbackServer


class BigAnswer(LoopbackServer):
    """Answers every request with more bytes than a socket buffer holds, then says how the write ended."""

    def __init__(self) -> None:
        super().__init__()
        self.done = threading.Event()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        try:
            body = b"x" * (32 << 20)
            request.send_response(200)
            request.send_header("Content-Length", str(len(body)))
            request.end_headers()
            request.wfile.write(body)
        finally:
            self.done.set()


def test_a_client_that_hangs_up_mid_download_prints_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    with BigAnswer() as server:
        host, port = server.address.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(b"GET /wheel HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(1024).startswith(b"HTTP/1.0 200")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        assert server.done.wait(10)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Broken pipe" not in err and "Connection reset" not in err, err
