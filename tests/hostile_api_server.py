"""A hostile embedding server on 127.0.0.1 for tests/test_hostile_api.py: every POST is answered by ``answer``, a
function given the handler (to write raw bytes: trickles, endless chunked bodies, lying headers), the request's
headers and its JSON body. GET (the model listing) is a 404. It records each request's headers."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a timeout, a refused answer) is no error of the server's: no traceback on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


class HostileServer:
    def __init__(self, answer: Callable[[BaseHTTPRequestHandler, dict[str, str], Any], None]):
        self.answer = answer
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                headers = dict(self.headers.items())
                server.headers.append(headers)
                try:
                    server.answer(self, headers, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should
                self.close_connection = True

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.api_base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    handler.send_response(status)
    # the handler closes each connection after one answer, and says so: a client that reused it would race the close
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "Connection": "close",
               **(headers or {})}
    for key, value in headers.items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


def inputs(body: dict) -> int:
    """How many vectors a request of the openai format asks for."""
    return 1 if "messages" in body else len(body.get("input") or [])
