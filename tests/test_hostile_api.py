"""Hostile embedding servers (``api:`` models): the key never shown or stored, no answer poisons the cache, nothing a
server sends makes clipcache hold or wait without bound, and every bad answer ends in one line.

Each case runs ``clipcache eval`` against a server on 127.0.0.1 (tests/hostile_api_server.py, or the real local
embedding server of scripts/fake_embedding_server.py where good answers are needed) and checks the one line, the exit
code and, where the case is about secrets, every file the run wrote.
"""

from __future__ import annotations

import base64
import gzip
import json
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hostile_api_server import HostileServer, inputs, send

from conftest import REPO
from hostile import assert_refused, run_cli

pytestmark = pytest.mark.hostile

KEY = "sk-hostile-5e1f-SENTINEL-key"


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def eval_argv(api_base: str, work: Path, *extra: str, limit: int = 4) -> list[str]:
    return ["eval", "--model", "api:m", "--api_base", api_base, "--dataset", "shapes", "--limit", str(limit),
            "--output_dir", str(work / "out"), "--cache_dir", str(work / "cache"), "--orchestrator", "local",
            "--quiet", "--api_max_retries", "0", *extra]


def files_holding(root: Path, *secrets: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes() for s in secrets)]


def vectors_answer(n: int, dim: int = 8, **extra) -> bytes:
    return json.dumps({"data": [{"index": i, "embedding": [float(i + 1)] * dim} for i in range(n)], **extra}).encode()


def hostile_run(answer, tmp_path, capsys, *extra: str) -> tuple[int, str]:
    with HostileServer(answer) as server:
        code, _, err = run_cli(eval_argv(server.api_base, tmp_path, *extra), capsys)
    return code, err


# -- #45.1: the key never shown or stored --------------------------------------------------------------------------
@pytest.mark.parametrize("status,as_json", [(400, True), (401, False), (422, True)])
def test_a_server_echoing_the_authorization_header_does_not_show_the_key(status, as_json, tmp_path, capsys):
    def answer(handler, headers, body):
        echo = f"invalid request; headers were: Authorization: {headers['Authorization']} (key {KEY[:20]}...)"
        send(handler, status, json.dumps({"error": {"message": echo}}).encode() if as_json else echo.encode(),
             {"Content-Type": "application/json" if as_json else "text/plain"})

    code, err = hostile_run(answer, tmp_path, capsys)
    assert_refused(code, err, f"HTTP {status}")
    assert KEY not in err and KEY[:20] not in err and "***" in err
    assert files_holding(tmp_path, KEY, KEY[:20]) == []


def test_an_echoed_key_never_reaches_prefect(tmp_path, capsys, prefect_server):
    import prefect.settings

    def answer(handler, headers, body):
        send(handler, 400, json.dumps({"error": {"message": f"echo {headers['Authorization']}"}}).encode())

    with HostileServer(answer) as server:
        argv = eval_argv(server.api_base, tmp_path)
        argv[argv.index("local")] = "prefect"
        code, _, err = run_cli(argv, capsys)
    assert code != 0 and "HTTP 400" in err and KEY not in err
    database = Path(prefect.settings.PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split("///", 1)[1])
    stored = [p for p in database.parent.rglob("*") if p.is_file()]
    assert database in stored
    assert files_holding(database.parent, KEY) == [] and files_holding(tmp_path, KEY) == []


@pytest.fixture(scope="module")
def good_server():
    sys.path.insert(0, str(REPO / "scripts"))
    from fake_embedding_server import FakeEmbeddingServer

    with FakeEmbeddingServer() as server:
        yield server


def good_argv(server, base: str, work: Path, *extra: str) -> list[str]:
    argv = eval_argv(base, work, *extra, limit=8)
    argv[argv.index("api:m")] = "api:tiny-shapes-clip"
    return argv


@pytest.mark.full  # the real local server (a model) is needed for a run that succeeds
def test_a_password_in_the_api_base_is_used_and_never_stored(good_server, tmp_path, capsys):
    good_server.reset()
    base = good_server.api_base.replace("http://", "http://alice:pw-SENTINEL-31@")
    code, out, err = run_cli(["-v", *good_argv(good_server, base, tmp_path)], capsys)
    assert code == 0, err
    basic = "Basic " + base64.b64encode(b"alice:pw-SENTINEL-31").decode()
    assert set(good_server.authorizations) == {basic}  # the credentials went as HTTP basic auth
    assert "pw-SENTINEL-31" not in out + err
    assert list((tmp_path / "out").rglob("*.parquet")) or list((tmp_path / "out").rglob("*.json"))
    assert files_holding(tmp_path, "pw-SENTINEL-31", basic.split()[1]) == []


# -- #45.2: no answer poisons the cache -----------------------------------------------------------------------------
@pytest.mark.full
@pytest.mark.parametrize("kind", ["overflow", "denormal", "zero_b64"])
def test_a_poisoned_vector_is_refused_and_a_rerun_gives_the_fresh_numbers(good_server, kind, tmp_path, capsys):
    good_server.reset()
    good_server.malformed_next, good_server.malformed = 1, kind
    argv = good_argv(good_server, good_server.api_base, tmp_path / "run")
    code, _, err = run_cli(argv, capsys)
    assert_refused(code, err, "norm" if kind != "zero_b64" else "all zeros")
    assert "malformed answer to 1 canary image(s)" in err and "nothing of it was kept" in err
    code, _, err = run_cli(argv, capsys)  # the good server now: the numbers of a fresh run
    assert code == 0, err
    code, _, err = run_cli(good_argv(good_server, good_server.api_base, tmp_path / "fresh"), capsys)
    assert code == 0, err

    def metrics(out: Path) -> dict:
        return {p.name: json.loads(p.read_text())["metrics"] for p in out.rglob("shapes_*.json")}

    assert metrics(tmp_path / "run" / "out") == metrics(tmp_path / "fresh" / "out") != {}


# -- #45.3: bounded answers and one deadline per request ------------------------------------------------------------
BIG = 200 << 20  # what a hostile answer would make clipcache hold; the bound for one input is 4.5 MiB


def _huge_length(handler, headers, body):
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(10 << 30))
    handler.end_headers()
    for _ in range(BIG // 65536):
        handler.wfile.write(b" " * 65536)


def _endless_chunks(handler, headers, body):
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b" " * 65536
    for _ in range(BIG // 65536):
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))


_BOMB = gzip.compress(b" " * BIG, compresslevel=9)


def _gzip_bomb(handler, headers, body):
    send(handler, 200, _BOMB, {"Content-Encoding": "gzip"})


@pytest.mark.parametrize("answer", [_huge_length, _endless_chunks, _gzip_bomb], ids=["content_length", "chunked",
                                                                                   "gzip_bomb"])
def test_an_unbounded_answer_is_refused_without_holding_it(answer, tmp_path, capsys):
    assert len(_BOMB) < 1 << 20  # the bomb is small on the wire
    tracemalloc.start()
    try:
        code, err = hostile_run(answer, tmp_path, capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_refused(code, err, "is larger than 4 MiB")
    assert peak < 64 << 20, f"held {peak >> 20} MiB"


def test_a_trickling_answer_runs_out_of_the_api_timeout(tmp_path, capsys):
    def answer(handler, headers, body):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "1000000")
        handler.end_headers()
        for _ in range(60):  # one byte every 0.25 s: each read is quick, the whole answer never comes
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.25)

    started = time.monotonic()
    code, err = hostile_run(answer, tmp_path, capsys, "--api_timeout", "1")
    assert_refused(code, err, "no answer within 1 s (--api_timeout)")
    assert time.monotonic() - started < 10


# -- #45.7: answers that used to end in a traceback -----------------------------------------------------------------
@pytest.mark.parametrize("index", [None, "0", 0.0, True])
def test_an_index_that_is_not_an_integer_is_one_line(index, tmp_path, capsys):
    def answer(handler, headers, body):
        send(handler, 200, json.dumps({"data": [{"index": index, "embedding": [1.0, 2.0]}]}).encode())

    code, err = hostile_run(answer, tmp_path, capsys)
    assert_refused(code, err, "'data[].index' is not 0..0")


def test_a_100000_deep_json_answer_is_one_line(tmp_path, capsys):
    def answer(handler, headers, body):
        send(handler, 200, b"[" * 100_000 + b"]" * 100_000)

    code, err = hostile_run(answer, tmp_path, capsys)
    assert_refused(code, err, "is not JSON (RecursionError")


@pytest.mark.parametrize("value", ["inf", "1e12", "nan", "Fri, 31 Dec 9999 23:59:59 GMT", "-inf"])
def test_an_unbounded_retry_after_is_one_line(value, tmp_path, capsys):
    def answer(handler, headers, body):
        send(handler, 429, b'{"error": {"message": "slow down"}}', {"Retry-After": value})

    started = time.monotonic()
    code, err = hostile_run(answer, tmp_path, capsys, "--api_max_retries", "3")
    if value == "-inf":  # no wait at all: retried at once, then the usual line
        assert_refused(code, err, "HTTP 429")
    else:
        assert_refused(code, err, "Retry-After")
        assert "waits at most 600 s" in err
    assert time.monotonic() - started < 20


def test_a_huge_usage_figure_neither_overflows_nor_throttles(tmp_path, capsys):
    def answer(handler, headers, body):
        send(handler, 200, vectors_answer(inputs(body), usage={"prompt_tokens": 1e300, "total_tokens": 1e300}))

    started = time.monotonic()
    code, err = hostile_run(answer, tmp_path, capsys, "--api_tpm", "100000")
    assert code == 0, err
    assert "Traceback" not in err and time.monotonic() - started < 30
