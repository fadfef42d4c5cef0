"""A small deterministic OpenAI-compatible chat-completions server, for the convert demo and tests (127.0.0.1 only).

    .venv/bin/python scripts/fake_vlm_server.py [--port 8008] [--delay 0.2]
    # then: api_base http://127.0.0.1:8008/v1

POST /v1/chat/completions with a user message holding text + an image data URL answers with a caption made from the
image's pixels: the colour of the object (the pixels that differ from the corner colour), its size, where it is, and
the background — so captions of the shapes data carry real information. Faults on demand (attributes of the server
object in tests): ``delay`` seconds per request, ``fail_next`` = [status, ...] answered before captioning (429 comes
with ``Retry-After: 0.05``; ``retry_after`` = seconds sends that value with every fault instead), ``hang`` (never
answer), ``always_status`` (e.g. 401 for every request), ``malformed_next`` = n (the next n requests get HTTP 200
with a body that is not JSON). Every request's arrival time (``times``, monotonic) and Authorization header are
recorded, so tests can check waits and that the key reached the server and nothing else.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

NAMED = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 200, 30),
         "purple": (140, 60, 180), "orange": (240, 130, 20), "white": (245, 245, 245), "black": (20, 20, 20),
         "gray": (128, 128, 128)}


def nearest(rgb) -> str:
    return min(NAMED, key=lambda n: sum((a - b) ** 2 for a, b in zip(NAMED[n], rgb, strict=True)))


def describe(image: Image.Image) -> str:
    px = np.asarray(image.convert("RGB").resize((64, 64)), dtype=np.int32)
    background = px[0, 0]
    mask = np.abs(px - background).sum(axis=2) > 60
    bg = nearest(background)
    if mask.sum() < 4:
        return f"a plain {bg} image"
    ys, xs = np.nonzero(mask)
    colour = nearest(px[mask].mean(axis=0))
    size = "large" if mask.sum() > 420 else "small"
    cx, cy = xs.mean() / 64, ys.mean() / 64
    if abs(cx - 0.5) < 0.12 and abs(cy - 0.5) < 0.12:
        where = "in the center"
    elif abs(cx - 0.5) > abs(cy - 0.5):
        where = "on the left" if cx < 0.5 else "on the right"
    else:
        where = "at the top" if cy < 0.5 else "at the bottom"
    fill = mask.sum() / ((np.ptp(xs) + 1) * (np.ptp(ys) + 1))
    shape = "square" if fill > 0.9 else "circle" if fill > 0.7 else "triangle or diamond" if fill > 0.45 else "cross"
    return f"a {size} {colour} {shape} {where} on a {bg} background"


class FakeVLMServer:
    def __init__(self, port: int = 0, delay: float = 0.0):
        self.delay = delay
        self.fail_next: list[int] = []
        self.retry_after: str | None = None
        self.hang = False
        self.always_status: int | None = None
        self.malformed_next = 0
        self.requests = 0
        self.times: list[float] = []
        self.authorizations: list[str] = []
        self.bodies: list[dict] = []
        self.open_connections = 0  # connections a handler thread is still serving (wait_idle)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle(self):
                with server._lock:
                    server.open_connections += 1
                try:
                    super().handle()
                finally:
                    with server._lock:
                        server.open_connections -= 1

            def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout, cancellation): nothing to answer

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests += 1
                    server.times.append(time.monotonic())
                    server.authorizations.append(self.headers.get("Authorization", ""))
                    server.bodies.append(body)
                    fault = server.fail_next.pop(0) if server.fail_next else server.always_status
                    malformed = server.malformed_next > 0
                    server.malformed_next -= malformed
                if server.hang:
                    time.sleep(3600)
                if server.delay:
                    time.sleep(server.delay)
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                if malformed:
                    raw = b'{"id": "chatcmpl-x", "choices": [{"message": '  # cut off: not JSON
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                if fault:
                    wait = server.retry_after or ("0.05" if fault == 429 else None)
                    headers = {"Retry-After": wait} if wait else {}
                    self._send(fault, {"error": {"message": f"injected {fault}", "type": "fake"}}, headers)
                    return
                try:
                    parts = body["messages"][-1]["content"]
                    url = next(p["image_url"]["url"] for p in parts if p.get("type") == "image_url")
                    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
                    caption = describe(image)
                except (KeyError, IndexError, StopIteration, ValueError, OSError) as e:
                    self._send(400, {"error": {"message": f"bad request: {e}"}})
                    return
                self._send(200, {"id": f"chatcmpl-{server.requests}", "object": "chat.completion",
                                 "created": int(time.time()), "model": body.get("model", ""),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": caption}}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.api_base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeVLMServer:
        self.thread.start()
        return self

    def wait_idle(self, quiet: float = 0.3, timeout: float = 30.0) -> None:
        """Wait until no connection has been open for `quiet` seconds: a killed client's requests that were already
        sent are then read and counted, so the next count starts with the next client's."""
        deadline = time.monotonic() + timeout
        idle_since = None
        while time.monotonic() < deadline:
            with self._lock:
                busy, seen = self.open_connections > 0, self.requests
            if busy:
                idle_since = None
            elif idle_since is None or idle_since[1] != seen:
                idle_since = (time.monotonic(), seen)
            elif time.monotonic() - idle_since[0] >= quiet:
                return
            time.sleep(0.02)
        raise TimeoutError(f"the fake VLM server still had open connections after {timeout} s")

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8008)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per request")
    args = parser.parse_args()
    server = FakeVLMServer(args.port, args.delay)
    print(f"serving an OpenAI-compatible API at {server.api_base} (Ctrl-C to stop)", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
