"""The fake IMDS takes a client that hangs up before its reply (an agent stopping mid-request) as normal: one debug
line, never socketserver's traceback on the local cloud's console (issue 63)."""

from __future__ import annotations

import logging
import socket
import struct
import time

import pytest

from jobplane.local.imds import FakeImds, ImdsInstance


def hang_up(port: int) -> None:
    """A GET, then a close that resets the connection (SO_LINGER 0) before the reply is read."""
    client = socket.create_connection(("127.0.0.1", port))
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.sendall(b"GET /latest/meta-data/instance-id HTTP/1.1\r\nHost: x\r\n\r\n")
    client.close()


def test_a_client_that_hangs_up_gets_one_debug_line_not_a_traceback(
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="jobplane.local.imds")
    with FakeImds(ImdsInstance("i-hangup")) as imds:
        port = int(imds.url.rsplit(":", 1)[1])
        for _ in range(50):  # the reset must reach the server before its reply does: a few tries at most
            hang_up(port)
            time.sleep(0.05)
            if any("hung up" in r.getMessage() for r in caplog.records):
                break
    assert any("hung up" in r.getMessage() for r in caplog.records), "no hang-up reached the server"
    assert "Traceback" not in capfd.readouterr().err
