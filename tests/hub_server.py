"""A local stand-in for the Hugging Face / ModelScope dataset file servers, on 127.0.0.1 only.

Serves ``<root>/<repo>/<path>`` at ``/datasets/<repo>/resolve/<main|master>/<path>``, with Content-Length, a sha256
``X-Linked-Etag`` for .tar files (as the Hugging Face hub does for LFS files) and HTTP Range support. Faults on demand:
``drop_once`` (send half of a file, then close the connection, the first time it is asked for) and ``corrupt``
(serve flipped bytes under the true etag).
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROUTE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>main|master)/(?P<path>.+)$")


class HubServer:
    def __init__(self, root: Path):
        self.root = root
        self.drop_once: set[str] = set()
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_HEAD(self):  # noqa: N802
                m = ROUTE.match(self.path)
                file = server.root / m["repo"] / m["path"] if m else None
                self.send_response(200 if file is not None and file.is_file() else 404)
                self.end_headers()

            def do_GET(self):  # noqa: N802
                server.requests.append((self.path, self.headers.get("Range")))
                m = ROUTE.match(self.path)
                file = server.root / m["repo"] / m["path"] if m else None
                if file is None or not file.is_file():
                    self.send_error(404)
                    return
                data = file.read_bytes()
                etag = hashlib.sha256(data).hexdigest()
                if m["path"] in server.corrupt:
                    data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
                start = 0
                if rng := self.headers.get("Range"):
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_error(416)
                        return
                body = data[start:]
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(body)))
                if file.suffix == ".tar":
                    self.send_header("X-Linked-Etag", f'"{etag}"')
                self.end_headers()
                if m["path"] in server.drop_once:
                    server.drop_once.discard(m["path"])
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.close()
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
