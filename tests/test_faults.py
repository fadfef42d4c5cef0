"""Fault injection (marked ``faults``; runs in CI with the full suite): SIGKILL at seeded points of encode, publish,
result and warehouse writes and convert, each followed by a re-run that must give the uninterrupted result and leave
nothing behind; two runs at once on one cache and one warehouse; a full disk; a flaky object store. (A killed CLI's
Prefect server dies with it: tests/test_faults_prefect.py, a file of its own so that the two balance across pytest
workers.)

Kill points are storage/faults.py's fail points. A census run (``CLIPCACHE_FAULT=census:<file>``) lists every point
an uninterrupted run passes, in order; the test draws its kill points from that list with a fixed seed, at least one
of each kind, so a change that adds or moves writes is covered without editing the test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clipcache.storage.cache_keys import DEFAULT_CHUNK_ROWS
from clipcache.storage.embedding_store import EmbeddingStore

from cli_zygote import Zygote
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
from fake_vlm_server import FakeVLMServer  # noqa: E402

pytestmark = [pytest.mark.faults, pytest.mark.full]

CLI = Path(sys.executable).parent / "clipcache"
EVAL = ["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "shapes_retrieval", "--limit", "96",
        "--batch_size", "16", "--orchestrator", "local", "--quiet"]
SEED = 20261124
EVAL_KILLS = 10  # every kind of point once (5 in an eval), the rest drawn; with CONVERT_KILLS: 14 per CI run
CONVERT_KILLS = 4  # both kinds a convert passes (caption, atomic-write), twice each on average
PARALLEL = 2  # cases run two at a time (each is two CLI processes, mostly start-up)


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CLIPCACHE_FAULT", "PREFECT_API_URL"))}
    return {**base, "CLIPCACHE_CHUNK_ROWS": "32", **extra}


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


@pytest.fixture(scope="module", autouse=True)
def _close_zygote():
    yield
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


def zygote() -> Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None:
            _zygote = Zygote(preload=("openai", "aiohttp"))  # what a convert run's captioning client imports
    return _zygote


def run(argv: list[str], work: Path, *, fsize: int | None = None, **extra: str) -> subprocess.CompletedProcess:
    """The CLI as a process of its own, forked from a zygote that imported torch once (tests/cli_zygote.py): the
    kills and re-runs here are ~30 CLI starts. The console script itself runs in tests/test_faults_prefect.py
    (killed CLIs, a CLI with a private server)."""
    work.mkdir(parents=True, exist_ok=True)
    return zygote().run(argv, work, env(PREFECT_HOME=str(work / "prefect"), **extra), timeout=300, fsize=fsize)


def eval_argv(work: Path) -> list[str]:
    return [*EVAL, "--output_dir", str(work / "out"), "--cache_dir", str(work / "cache")]


def results(out: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text())["metrics"] for p in sorted(out.glob("*/*.json"))}


def counted_runs(out: Path) -> list[list[tuple]]:
    """The warehouse's ``metrics`` view, run by run: the metric rows of completed runs only (a killed run has no run
    row, so its rows never count). (Not the ``leaderboard`` view: --limit runs never reach it, it is empty here.)"""
    from clipcache.storage.warehouse import connect

    runs: dict[str, list[tuple]] = {}
    for run_id, *row in connect(str(out)).execute(
            "select run_id, dataset, metric, k, value from metrics order by all").fetchall():
        runs.setdefault(run_id, []).append(tuple(row))
    return list(runs.values())


def leftovers(work: Path) -> list[str]:
    found = [str(p.relative_to(work)) for p in work.rglob("*") if p.name.endswith(".tmp")]
    if (work / "cache" / "embeddings").exists():
        store = EmbeddingStore(work / "cache")
        found += [f"partial {k}" for k in store.partial_keys()]
        found += [f"damaged {k}" for k in store.keys() if store.verify(k)]
    return found


def census(argv: list[str], work: Path, **extra: str) -> list[str]:
    record = work / "census.txt"
    done = run(argv, work, CLIPCACHE_FAULT=f"census:{record}", **extra)
    assert done.returncode == 0, done.stderr
    return record.read_text().split()


def draw(points: list[str], n: int) -> list[tuple[str, int]]:
    """Seeded (point, occurrence) pairs among those a run passes: every kind once, the rest at random."""
    occurrences = []
    seen: Counter[str] = Counter()
    for name in points:
        seen[name] += 1
        occurrences.append((name, seen[name]))
    rng = random.Random(SEED)
    chosen = [rng.choice([o for o in occurrences if o[0] == kind]) for kind in sorted(seen)]
    rest = [o for o in occurrences if o not in chosen]
    return chosen + rng.sample(rest, min(len(rest), n - len(chosen)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    work = tmp_path_factory.mktemp("reference")
    points = census(eval_argv(work), work)
    runs = counted_runs(work / "out")
    assert len(runs) == 1 and len(runs[0]) >= 9, runs  # shapes' 3 metrics and shapes_retrieval's 6
    return {"points": points, "results": results(work / "out"), "metrics": runs}


def test_sigkill_at_seeded_points_then_rerun_equals_the_uninterrupted_run(reference, tmp_path):
    kills = draw(reference["points"], EVAL_KILLS)
    assert len(kills) >= EVAL_KILLS and {k for k, _ in kills} >= {"encode-rows", "encode-commit", "publish",
                                                                    "atomic-write", "pair-done"}
    def one(kill: tuple[str, int]) -> str | None:
        point, nth = kill
        work = tmp_path / f"{point}-{nth}"
        killed = run(eval_argv(work), work, CLIPCACHE_FAULT=f"{point}:{nth}")
        if killed.returncode != -signal.SIGKILL:
            return f"{kill}: not killed (exit {killed.returncode}): {killed.stderr[-1000:]}"
        again = run(eval_argv(work), work)
        if again.returncode != 0:
            return f"{kill}: the re-run failed: {again.stderr[-1000:]}"
        if results(work / "out") != reference["results"]:
            return f"{kill}: results differ from the uninterrupted run"
        if counted_runs(work / "out") != reference["metrics"]:  # the killed run counts nowhere
            return f"{kill}: the warehouse's metrics differ from the uninterrupted run's"
        if left := leftovers(work):
            return f"{kill}: left behind {left}"
        return None

    with ThreadPoolExecutor(PARALLEL) as pool:
        failures = [f for f in pool.map(one, kills) if f]
    assert failures == []
    print(f"\nSIGKILL points: {len(kills)} ({dict(Counter(k for k, _ in kills))})")


def test_sigkill_during_convert_then_rerun_gives_the_same_beir_folder(tmp_path):
    with FakeVLMServer() as vlm:
        def config(work: Path) -> Path:
            cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
                "models": [{"model_name": "captioner", "api_base": vlm.api_base, "api_key": "k"}],
                "dataset_name": ["shapes_retrieval"], "split": "test", "task": "image_caption", "limit": 24,
                "batch_size": 4, "verbose": False, "output_dir": str(work / "out"),
                "cache_dir": str(work / "cache")}}}
            work.mkdir(parents=True, exist_ok=True)
            (work / "cfg.json").write_text(json.dumps(cfg))
            return work / "cfg.json"

        def folder(work: Path) -> dict[str, str]:
            beir = work / "out" / "captioner" / "shapes_retrieval" / "retrieval_data"
            return {str(p.relative_to(beir)): p.read_text() for p in sorted(beir.rglob("*")) if p.is_file()}

        ref = tmp_path / "reference"
        points = census(["run", str(config(ref))], ref)
        expected = folder(ref)
        assert expected and "caption" in points
        kills = draw([p for p in points if p in ("caption", "atomic-write")], CONVERT_KILLS)
        for point, nth in kills:
            work = tmp_path / f"{point}-{nth}"
            killed = run(["run", str(config(work))], work, CLIPCACHE_FAULT=f"{point}:{nth}")
            assert killed.returncode == -signal.SIGKILL, (point, nth, killed.stderr[-2000:])
            vlm.wait_idle()  # what the killed run had already sent counts as its own, not as the rerun's
            calls = len(vlm.bodies)
            again = run(["run", str(config(work))], work)
            assert again.returncode == 0, (point, nth, again.stderr[-2000:])
            assert folder(work) == expected, (point, nth)
            assert len(vlm.bodies) - calls <= 24 - (nth - 1 if point == "caption" else 0)  # finished work is kept
            assert leftovers(work) == [], (point, nth)


def test_two_runs_at_once_on_one_cache_and_one_warehouse(reference, tmp_path):
    work = tmp_path / "shared"
    work.mkdir()
    # both started before either is waited for: two CLI processes (forked from the zygote) at once
    procs = [zygote().start(eval_argv(work), work, env(PREFECT_HOME=str(work / f"p{i}"))) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert results(work / "out") == reference["results"]
    assert counted_runs(work / "out") == reference["metrics"] * 2  # two complete runs, each counted once
    assert leftovers(work) == []
    store = EmbeddingStore(work / "cache")
    assert len(store.keys()) == 4  # each entry once: the second writer waited and reused the first's


def test_a_full_disk_is_one_line_and_the_same_command_then_finishes(reference, tmp_path):
    """A file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as they fail with ENOSPC on a full disk)
    that the first cache chunk exceeds: one line, a non-zero exit; without the limit the same command finishes
    and gives the uninterrupted run's numbers."""
    chunks = {"CLIPCACHE_CHUNK_ROWS": str(DEFAULT_CHUNK_ROWS)}  # one chunk per entry: the first is 96 x 64 float32,
    full = run(eval_argv(tmp_path), tmp_path, fsize=16 * 1024, **chunks)  # 24 KB; nothing written before it is 1 KB
    assert full.returncode == 1 and full.stderr.strip().count("\n") == 0, full.stderr[-2000:]
    assert "file size limit exceeded" in full.stderr and "the same command continues" in full.stderr
    assert not (tmp_path / "out" / "tiny-shapes-clip").exists() and leftovers(tmp_path) == [
        f"partial {k}" for k in EmbeddingStore(tmp_path / "cache").partial_keys()]  # resumable, nothing else
    again = run(eval_argv(tmp_path), tmp_path, **chunks)
    assert again.returncode == 0, again.stderr[-2000:]
    assert results(tmp_path / "out") == reference["results"] and leftovers(tmp_path) == []


class FlakyS3Proxy:
    """An HTTP proxy in front of the S3 server that answers a seeded share of requests with 503 SlowDown (what S3
    says under load) and delays others, so the remote path meets errors and latency as a real store would give."""

    def __init__(self, upstream: str, error_rate: float = 0.12, delay_rate: float = 0.1, seed: int = SEED):
        import http.client
        import threading
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.errors = self.delays = self.requests = 0
        rng, lock, proxy = random.Random(seed), threading.Lock(), self
        target = urllib.parse.urlsplit(upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        out += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                    return out
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self) -> None:
                body = self._body()
                with lock:
                    proxy.requests += 1
                    roll = rng.random()
                if roll < proxy.error_rate:
                    with lock:
                        proxy.errors += 1
                    payload = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                               b"<Message>Please reduce your request rate.</Message></Error>")
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                if roll < proxy.error_rate + proxy.delay_rate:
                    with lock:
                        proxy.delays += 1
                    time.sleep(0.05)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding",)}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # a HEAD answer has no body but tells the object's size
                self.send_header("Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815

        self.error_rate, self.delay_rate = error_rate, delay_rate
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def short_waits_between_retries(folder: Path) -> dict[str, str]:
    """botocore's own retries of the 503s, unchanged but for how long each waits. In its legacy mode (its default)
    botocore retries 503 SlowDown and the other transient errors up to 5 attempts, waiting rand(0, 1) x 2^n s between
    them, as its data file ``_retry.json`` says; ``AWS_DATA_PATH`` (boto3's documented search path for botocore data,
    read before the built-in data) names a folder holding a copy of that file whose base wait is 10 ms instead. Same
    attempts, same errors retried; the run's ~60 retries then wait about 1 s in all instead of ~40 s."""
    import botocore.loaders

    config = botocore.loaders.Loader().load_data("_retry")
    config["retry"]["__default__"]["delay"]["base"] = 0.01
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "_retry.json").write_text(json.dumps(config))
    return {"AWS_DATA_PATH": str(folder), "AWS_RETRY_MODE": "legacy"}


def test_a_flaky_object_store_gives_the_same_results_or_one_line_then_the_same_results(s3_endpoint, bucket,
                                                                                         reference, tmp_path):
    """Cache and results on S3 behind a proxy that fails 12% of requests with 503 and delays 10%: every attempt
    either succeeds or ends in one line (no traceback); attempts continue from what earlier ones finished, and the
    results equal the local, uninterrupted run's."""
    proxy = FlakyS3Proxy(s3_endpoint)
    argv = [*EVAL, "--cache_dir", f"s3://{bucket}/cache", "--output_dir", f"s3://{bucket}/results"]
    # the default chunk size: one chunk per entry, not 32-row chunks (the kills above need those; here they only
    # multiplied the requests, each a 12% chance of a 503 and a retry that waits)
    extra = {"AWS_ENDPOINT_URL": proxy.url, "CLIPCACHE_LOCAL_DIR": str(tmp_path / "local"),
             "CLIPCACHE_CHUNK_ROWS": str(DEFAULT_CHUNK_ROWS), **short_waits_between_retries(tmp_path / "botocore")}
    try:
        attempts = []
        for _ in range(5):
            done = run(argv, tmp_path, **extra)
            attempts.append(done.returncode)
            if done.returncode == 0:
                break
            assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
        assert attempts[-1] == 0, attempts
    finally:
        proxy.close()
    assert proxy.errors > 0 and proxy.delays > 0  # the faults really happened
    from clipcache.storage.paths import as_path

    found = {p.name: json.loads(p.read_text())["metrics"]
             for p in as_path(f"s3://{bucket}/results/tiny-shapes-clip").iterdir() if p.name.endswith(".json")}
    assert found == reference["results"]
    store = EmbeddingStore(f"s3://{bucket}/cache")
    assert store.partial_keys() == [] and all(store.verify(k) == [] for k in store.keys())
    print(f"\nflaky store: {proxy.requests} requests, {proxy.errors} answered 503, {proxy.delays} delayed; "
          f"attempts: {attempts}")
