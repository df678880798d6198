"""The local cloud's werkzeug servers keep a connection for the next request (jobplane.local.keep_alive): bodies of
each framing read whole, HEAD's length kept without a body, an application error a 500 that ends the connection;
and moto's server, as the local cloud runs it, answers S3 requests on one connection."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from werkzeug.serving import WSGIRequestHandler, make_server

from jobplane.local.cloud import ServiceProcess
from jobplane.local.keep_alive import keep_alive


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """Says the method and the body it read; /boom raises; HEAD answers the length a GET would have."""
    if environ["PATH_INFO"] == "/boom":
        raise RuntimeError("boom")
    body = environ["wsgi.input"].read()
    answer = f"{environ['REQUEST_METHOD']} {len(body)} {body[:8].decode()}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(answer)))])
    return [] if environ["REQUEST_METHOD"] == "HEAD" else [answer]


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    srv = make_server("127.0.0.1", 0, app, threaded=True, request_handler=keep_alive(WSGIRequestHandler))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)


def test_one_connection_carries_requests_of_every_framing(server: tuple[str, int]) -> None:
    conn = http.client.HTTPConnection(*server, timeout=10)
    try:
        conn.request("PUT", "/a", body=b"x" * 100_000, headers={"Expect": "100-continue"})
        first = conn.sock
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"PUT 100000 xxxxxxxx")
        conn.request("POST", "/b", body=iter([b"chunk-one", b"chunk-two"]))  # an iterator: sent chunked
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"POST 18 chunk-on")
        conn.request("HEAD", "/c")
        r = conn.getresponse()
        assert (r.status, r.getheader("Content-Length"), r.read()) == (200, "7", b"")  # "HEAD 0 "
        conn.request("GET", "/d")
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"GET 0 ")
        assert conn.sock is first  # never reconnected
        conn.request("GET", "/boom")
        r = conn.getresponse()
        assert (r.status, r.getheader("Connection"), r.read()) == (500, "close", b"Internal Server Error")
    finally:
        conn.close()


def test_moto_s_server_answers_s3_on_one_connection(tmp_path: Path) -> None:
    moto = ServiceProcess("jobplane.local.moto_server").start(tmp_path / "moto.log")
    conn = http.client.HTTPConnection("127.0.0.1", moto.port, timeout=10)
    try:
        answers = []
        for method, path, body in [("PUT", "/keep", b""), ("PUT", "/keep/k", b"value"), ("GET", "/keep/k", None),
                                   ("HEAD", "/keep/k", None), ("GET", "/keep?list-type=2", None),
                                   ("DELETE", "/keep/k", None), ("GET", "/keep/k", None)]:
            signed = AWSRequest(method, moto.url + path, data=body or b"")
            SigV4Auth(Credentials("k", "s"), "s3", "us-east-1").add_auth(signed)  # as boto3 signs
            conn.request(method, path, body=body, headers=dict(signed.headers))
            sock = conn.sock
            r = conn.getresponse()
            answers.append((r.status, r.read()[:5], r.getheader("Content-Length") if method == "HEAD" else None))
            assert conn.sock is sock and not r.will_close, (method, path)  # werkzeug's own closed every one
        assert [a[0] for a in answers] == [200, 200, 200, 200, 200, 204, 404]
        assert answers[2][1] == b"value" and answers[3][2] == "5" and answers[4][1] == b"<?xml"
    finally:
        conn.close()
        moto.stop()
