"""Keep-alive for the local cloud's werkzeug servers (moto's, the GCS fake): each request is answered on the
connection it came on, and that connection kept for the next one (HTTP/1.1), instead of werkzeug's close after
every response.

werkzeug's development server closes every connection because http.server cannot tell where a body the
application left unread ends. Here the whole body is read before the application runs, and every answer carries
its length, so the next request line is where the stream stands. A request then costs no TCP connection, no server
thread and no reconnect of the client's own: against moto's server closing each, the local cloud's functions, its
VMs' agents and the CLI paid for one per call, about a quarter of the CPU a small request costs both sides.
"""

from __future__ import annotations

import io
import traceback
from typing import Any

from werkzeug.serving import WSGIRequestHandler

IDLE_S = 120.0  # a kept connection nobody uses for this long is closed (a client reconnects by itself)


def keep_alive(base: type[WSGIRequestHandler]) -> type[WSGIRequestHandler]:
    """`base` (werkzeug's handler, or one made from it), answering on kept connections."""

    class KeepAlive(base):  # type: ignore[misc,valid-type]  # a class made from an argument
        protocol_version = "HTTP/1.1"  # parse_request sends 100 Continue and reads Connection: close itself
        timeout = IDLE_S  # werkzeug's handle() takes the timeout for a dropped connection: the client opens another
        disable_nagle_algorithm = True  # an answer goes out whole at once, not held for the client's ACK

        def run_wsgi(self) -> None:
            environ = self.environ = self.make_environ()  # werkzeug's (moto's: its header names), with a dechunker
            body = environ["wsgi.input"].read() if environ.get("wsgi.input_terminated") else \
                self.rfile.read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
            environ.pop("wsgi.input_terminated", None)
            status, headers, data = self._answer(environ)
            code = int(status.split(None, 1)[0])
            self.send_response(code, status.partition(" ")[2])
            for name, value in headers:
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            if self.command == "HEAD" or code in (204, 304) or code < 200:
                length = next((v for k, v in headers if k.lower() == "content-length"), None)
                if length is not None and self.command == "HEAD":
                    self.send_header("Content-Length", length)  # the object's, with no body
                data = b""
            else:
                self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self._headers_buffer.append(b"\r\n" + data)  # headers and body in one write (http.server's buffer)
            self.flush_headers()

        def _answer(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
            """The application's status, headers and whole body; a 500 (and this connection's end) if it raised."""
            started: list[Any] = []
            chunks: list[bytes] = []

            def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                started[:] = [status, headers]
                return chunks.append

            try:
                result = self.server.app(environ, start_response)
                try:
                    chunks.extend(result)
                finally:
                    if hasattr(result, "close"):
                        result.close()
            except Exception:  # as werkzeug answers one
                self.log_error("Error on request:\n%s", traceback.format_exc())
                self.close_connection = True
                return "500 Internal Server Error", [("Content-Type", "text/plain")], b"Internal Server Error"
            return started[0], started[1], b"".join(chunks)

    return KeepAlive
