"""A local stand-in for the Hugging Face / ModelScope dataset file servers, on 127.0.0.1 only.

Serves ``<root>/<repo>/<path>`` the way each hub's client library asks for it:

- Hugging Face (``huggingface_hub.hf_hub_download``): ``HEAD`` / ``GET /datasets/<repo>/resolve/<rev>/<path>``, with
  ``X-Repo-Commit``, an ``ETag`` (the sha256 of the bytes, as the hub gives for LFS files, also as ``X-Linked-Etag``
  and ``X-Linked-Size``) and ``X-Error-Code: EntryNotFound`` / ``RepoNotFound`` on a 404.
- ModelScope (``dataset_file_download``): ``GET /api/v1/datasets/<repo>/repo?Revision=<rev>&FilePath=<path>``.
- Hugging Face model repositories (``huggingface_hub.snapshot_download``): ``GET /api/models/<repo>/revision/<rev>``
  (the commit), ``GET /api/models/<repo>/tree/<rev>`` (every file, one page) and ``HEAD`` / ``GET
  /<repo>/resolve/<rev>/<path>``. A model repository's commit is a digest of its files, so changing a served file
  makes a new commit, as a push does.

Both support HTTP Range. Faults on demand: ``drop_once`` (send half of a file, then close the connection, the first
time it is asked for) and ``corrupt`` (serve flipped bytes under the true etag). ``requests`` records each GET path
with its Range header and its Authorization header.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HF_ROUTE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>[^?]+)$")
MS_ROUTE = re.compile(r"^/api/v1/datasets/(?P<repo>[^/]+/[^/]+)/repo$")
MODEL_ROUTE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>[^?]+)$")
MODEL_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<what>revision|tree)/(?P<rev>[^/]+)$")
COMMIT = "0" * 39 + "1"


def model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def model_commit(folder: Path) -> str:
    """A model repository's commit: the SHA-1 of its files' names and contents."""
    h = hashlib.sha1()
    for p in model_files(folder):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


class HubServer:
    def __init__(self, root: Path):
        self.root = root
        self.drop_once: set[str] = set()
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str | None]] = []
        self.authorizations: list[str | None] = []
        self.heads: list[str] = []  # the paths HEAD asked for
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _locate(self) -> tuple[Path | None, str, str]:
                """(file or None, repo, path inside the repo)"""
                url = urllib.parse.urlsplit(self.path)
                if m := HF_ROUTE.match(url.path):
                    repo, path = m["repo"], urllib.parse.unquote(m["path"])
                elif (m := MODEL_ROUTE.match(url.path)) and not url.path.startswith("/api/"):
                    repo, path = m["repo"], urllib.parse.unquote(m["path"])
                elif m := MS_ROUTE.match(url.path):
                    query = urllib.parse.parse_qs(url.query)
                    repo, path = m["repo"], query.get("FilePath", [""])[0]
                else:
                    return None, "", ""
                file = server.root / repo / path
                return (file if path and file.is_file() else None), repo, path

            def _not_found(self, repo: str) -> None:
                self.send_response(404)
                exists = bool(repo) and (server.root / repo).is_dir()
                self.send_header("X-Error-Code", "EntryNotFound" if exists else "RepoNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _model_api(self) -> bool:
                """The model API's JSON answers (repository info, file tree); False for any other path."""
                m = MODEL_API.match(urllib.parse.urlsplit(self.path).path)
                if m is None:
                    return False
                folder = server.root / m["repo"]
                if not folder.is_dir():
                    self._not_found(m["repo"])
                    return True
                files = [(p.relative_to(folder).as_posix(), p.read_bytes()) for p in model_files(folder)]
                if m["what"] == "revision":
                    body = {"id": m["repo"], "sha": model_commit(folder),
                            "siblings": [{"rfilename": name} for name, _ in files]}
                else:
                    body = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                            for name, data in files]
                text = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)
                return True

            def _headers(self, file: Path, data: bytes, length: int) -> None:
                etag = hashlib.sha256(data).hexdigest()
                self.send_header("Content-Length", str(length))
                repo = file.relative_to(server.root).parts[:2]
                model = not self.path.startswith("/datasets/") and not self.path.startswith("/api/v1/")
                self.send_header("X-Repo-Commit", model_commit(server.root.joinpath(*repo)) if model else COMMIT)
                self.send_header("ETag", f'"{etag}"')
                if file.suffix == ".tar":
                    self.send_header("X-Linked-Etag", f'"{etag}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Accept-Ranges", "bytes")

            def do_HEAD(self):  # noqa: N802
                server.heads.append(self.path)
                file, repo, _ = self._locate()
                if file is None:
                    self._not_found(repo)
                    return
                data = file.read_bytes()
                self.send_response(200)
                self._headers(file, data, len(data))
                self.end_headers()

            def do_GET(self):  # noqa: N802
                server.requests.append((self.path, self.headers.get("Range")))
                server.authorizations.append(self.headers.get("Authorization"))
                if self._model_api():
                    return
                file, repo, path = self._locate()
                if file is None:
                    self._not_found(repo)
                    return
                true = file.read_bytes()
                data = bytes(b ^ 0xFF for b in true[:64]) + true[64:] if path in server.corrupt else true
                start, end = 0, len(data) - 1
                if rng := self.headers.get("Range"):
                    first, _, last = rng.split("=")[1].partition("-")
                    start, end = int(first), min(int(last), end) if last else end
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                body = data[start:end + 1]
                self.send_response(206 if rng else 200)
                self._headers(file, true, len(body))
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.end_headers()
                if path in server.drop_once:
                    server.drop_once.discard(path)
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
