"""Embedding models behind an HTTP API (``api:<model id>``), against a real local OpenAI-compatible server
(scripts/fake_embedding_server.py on 127.0.0.1) that serves the bundled tiny-shapes-clip.

The same model through the API gives the numbers of the model run locally; a re-run sends nothing; throttling, server
errors, stalls, malformed answers, a missing key and a changed model each end as they should (retried and
successful, or one line on stderr, a non-zero exit and nothing half-written); a killed encode resumes without asking
again for what it stored; the key reaches the server and no file. Tests using ``embedding_server`` are in the full
tier (tests/conftest.py: FULL_TIER_FIXTURES); the pure ones (rate limits, answers, identity, flags) are fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_bad_input_corpus import assert_nothing_half_written

from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.api_client import RateLimiter, estimate_text_tokens
from clipcache.tasks.models.api_formats import API_FORMATS, MalformedResponse, RequestFormat
from clipcache.tasks.models.api_spec import today_revision
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
from fake_embedding_server import FakeEmbeddingServer  # noqa: E402

KEY = "sk-clipcache-test-7f3a9c-SENTINEL"
CLI = Path(sys.executable).parent / "clipcache"
QUIET = ["--orchestrator", "local", "--quiet"]


@pytest.fixture(scope="module")
def _server():
    with FakeEmbeddingServer() as server:
        yield server


@pytest.fixture
def embedding_server(_server, monkeypatch):
    _server.reset()
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    yield _server
    _server.reset()


def api_eval(server: FakeEmbeddingServer, work: Path, *extra: str, datasets: tuple[str, ...] = ("shapes",),
             limit: int = 8, model: str = "api:tiny-shapes-clip", out: str = "out") -> list[str]:
    return ["eval", "--model", model, "--api_base", server.api_base, "--dataset", *datasets, "--limit", str(limit),
            "--output_dir", str(work / out), "--cache_dir", str(work / "cache"), *QUIET, *extra]


def cli(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err.strip()


def fails_in_one_line(argv: list[str], capsys, *phrases: str, work: Path) -> str:
    code, err = cli(argv, capsys)
    assert code not in (0, None), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    assert_nothing_half_written(work)
    return err


def metrics(out: Path) -> dict[str, dict]:
    return {json.loads(p.read_text())["dataset"]: json.loads(p.read_text())["metrics"]
            for p in sorted(out.rglob("*.json")) if "warehouse" not in p.parts}


def vectors(cache: Path) -> dict[tuple[str, str], np.ndarray]:
    store = EmbeddingStore(cache)
    found = {}
    for key in store.keys():
        entry = store.open(key)
        if entry.kind in ("image", "caption"):
            found[(entry.kind, entry.meta["dataset"])] = entry.embeddings()
    return found


def cost_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("api model")]


# -- numbers, cache, cost line ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["base64", "float"])
def test_the_api_model_gives_the_local_models_numbers_and_a_rerun_sends_nothing(embedding_server, encoding,
                                                                                tmp_path, capsys):
    datasets = ("shapes", "shapes_retrieval")
    local = ["eval", "--model", "tiny-shapes-clip", "--dataset", *datasets, "--limit", "40", "--output_dir",
             str(tmp_path / "local" / "out"), "--cache_dir", str(tmp_path / "local" / "cache"), *QUIET]
    assert cli(local, capsys)[0] == 0
    argv = api_eval(embedding_server, tmp_path / "api", "--api_encoding_format", encoding, "--price_per_1k", "0.02",
                    datasets=datasets, limit=40)
    code, err = cli(argv, capsys)
    assert code == 0, err
    assert metrics(tmp_path / "api" / "out") == metrics(tmp_path / "local" / "out")
    mine, theirs = vectors(tmp_path / "api" / "cache"), vectors(tmp_path / "local" / "cache")
    assert set(mine) == set(theirs) == {("image", "shapes"), ("image", "shapes_retrieval"),
                                        ("caption", "shapes_retrieval")}
    for what in mine:  # texts go in the local batches, images one per request: fp32 tolerance
        np.testing.assert_allclose(mine[what], theirs[what], atol=1e-6, err_msg=str(what))
    [line] = cost_lines(err)  # one line, once per model
    requests = embedding_server.requests
    assert f"{requests} requests (2 canary)" in line and "80 images" in line and "retries" in line
    assert "tokens" in line and "est. $" in line
    code, err = cli(argv, capsys)  # everything cached: the model is not even loaded
    assert code == 0 and embedding_server.requests == requests and not cost_lines(err)


def test_text_batches_go_as_concurrent_requests_of_one_batch_each(embedding_server, tmp_path, capsys):
    """Texts go one request per --batch_size texts with up to --api_concurrency requests in flight (text
    retrieval: no image request runs beside them); the numbers are those of one request at a time."""
    from test_evalscope_configs import write_retrieval_folder

    folder = write_retrieval_folder(tmp_path / "data")
    seen = {}
    for concurrency in (1, 4):
        embedding_server.reset()
        embedding_server.delay = 0.05
        argv = api_eval(embedding_server, tmp_path / f"c{concurrency}", "--task", "text_retrieval", "--dataset_root",
                        str(folder), "--batch_size", "4", "--api_concurrency", str(concurrency),
                        datasets=("ShapesRetrieval",))
        code, err = cli(argv, capsys)
        assert code == 0, err
        seen[concurrency] = (embedding_server.max_in_flight, list(embedding_server.text_counts))
    assert seen[1][0] == 1 and seen[4][0] > 1  # before: one text request at a time at any concurrency
    assert sorted(seen[1][1]) == sorted(seen[4][1]) and max(seen[4][1]) == 4  # the same requests: a batch each
    assert metrics(tmp_path / "c4" / "out") == metrics(tmp_path / "c1" / "out")


def test_the_cost_line_counts_the_requests_of_sharded_workers(embedding_server, tmp_path, capsys, prefect_server,
                                                              monkeypatch):
    """--task_runner threads: each worker's copy of the model sends its own requests (canaries, probe, shards); the
    run's one cost line counts them all, as the server saw them. The flow run reports to the test's Prefect API
    (PREFECT_API_URL, as a configured user's would) instead of starting a private server for the call."""
    import prefect.settings

    monkeypatch.setenv("PREFECT_API_URL", prefect.settings.PREFECT_API_URL.value())
    argv = api_eval(embedding_server, tmp_path, "--task_runner", "threads", "--workers", "2", "--shard_rows", "8",
                    "--batch_size", "8", datasets=("shapes_retrieval",), limit=24)
    argv.remove("local")  # a task runner runs inside a Prefect flow run
    argv.remove("--orchestrator")
    code, err = cli(argv, capsys)
    assert code == 0, err
    [line] = cost_lines(err)
    assert f"{embedding_server.requests} requests" in line, (line, embedding_server.requests)
    assert "24 images" in line  # every image once, though no image was encoded in the flow's own process


def test_the_key_reaches_the_server_and_no_file_or_log(embedding_server, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever lands in the working directory is searched too
    code = main(["-v", *api_eval(embedding_server, tmp_path, datasets=("shapes", "shapes_retrieval"))])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert embedding_server.authorizations and set(embedding_server.authorizations) == {f"Bearer {KEY}"}
    assert KEY not in out + err
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in written) and any("api_canaries" in p.parts for p in written)
    assert [p for p in written if KEY.encode() in p.read_bytes()] == []


def test_the_key_is_not_in_prefect_parameters_or_logs(embedding_server, prefect_server, tmp_path, capsys):
    import prefect.settings

    argv = ["eval", "--model", "api:tiny-shapes-clip", "--api_base", embedding_server.api_base, "--dataset", "shapes",
            "--limit", "8", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"),
            "--orchestrator", "prefect", "--quiet"]
    code, err = cli(argv, capsys)
    assert code == 0, err
    database = Path(prefect.settings.PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split("///", 1)[1])
    files = [p for p in database.parent.iterdir() if p.is_file()] + [p for p in tmp_path.rglob("*") if p.is_file()]
    assert database in files
    assert [p for p in files if KEY.encode() in p.read_bytes()] == []


# -- transient failures: retried ------------------------------------------------------------------------------------
def test_throttling_and_server_errors_are_retried_honouring_retry_after(embedding_server, tmp_path, capsys):
    embedding_server.fail_next = [500, 408, 429, 503]  # the first canary request, one at a time
    embedding_server.retry_after = "0.15"
    code, err = cli(api_eval(embedding_server, tmp_path, "--api_concurrency", "1"), capsys)
    assert code == 0, err
    times = embedding_server.times
    assert times[3] - times[2] >= 0.15 and times[4] - times[3] >= 0.15  # 429 and 503 carried Retry-After: 0.15
    assert "4 retries" in cost_lines(err)[0]
    assert json.loads(next((tmp_path / "out").rglob("shapes_*.json")).read_text())["metrics"]["acc1"] >= 0


def test_a_stalled_request_times_out_and_is_retried(embedding_server, tmp_path, capsys):
    # 1.5 s: a timeout well above an unstalled request's time even at load 10 (0.5 s once timed out a second one)
    embedding_server.stall_next, embedding_server.stall_seconds = 1, 3.0
    started = time.monotonic()
    code, err = cli(api_eval(embedding_server, tmp_path, "--api_timeout", "1.5"), capsys)
    assert code == 0, err
    assert "1 retries" in cost_lines(err)[0] and time.monotonic() - started < 30


def test_requests_are_spread_to_the_requests_per_minute_limit(embedding_server, tmp_path, capsys):
    code, err = cli(api_eval(embedding_server, tmp_path, "--api_rpm", "240", limit=6), capsys)
    assert code == 0, err
    times = embedding_server.times  # 2 canary + 6 image + 2 prompt requests at 4 a second, one second's burst (4)
    assert len(times) == 10 and times[-1] - times[0] >= (len(times) - 4) * 0.25 * 0.95


# -- failures: one line, nothing half-written -------------------------------------------------------------------------
def test_a_server_that_never_answers_ends_in_one_line(embedding_server, tmp_path, capsys):
    embedding_server.hang, embedding_server.stall_seconds = True, 2.0
    started = time.monotonic()
    fails_in_one_line(api_eval(embedding_server, tmp_path, "--api_timeout", "0.3", "--api_max_retries", "1"), capsys,
                      "api model 'tiny-shapes-clip'", "no answer within 0.3 s", "after 2 attempt(s)", work=tmp_path)
    assert embedding_server.requests == 2 and time.monotonic() - started < 20


@pytest.mark.parametrize("status,phrase", [(401, "HTTP 401"), (400, "HTTP 400"), (422, "HTTP 422")])
def test_a_client_error_is_not_retried(embedding_server, status, phrase, tmp_path, capsys):
    embedding_server.always_status = status
    fails_in_one_line(api_eval(embedding_server, tmp_path), capsys, "api model 'tiny-shapes-clip'", phrase,
                      "not retried", work=tmp_path)
    assert embedding_server.requests == 1


def test_an_unknown_model_id_names_the_servers_answer(embedding_server, tmp_path, capsys):
    fails_in_one_line(api_eval(embedding_server, tmp_path, model="api:tiny-shapes-clap"), capsys, "HTTP 404",
                      "does not exist", work=tmp_path)


@pytest.mark.parametrize("kind,phrase", [("not_json", "is not JSON"), ("count", "0 embeddings for 1 inputs"),
                                         ("nan", "NaN"), ("dims", "dimensional vectors")])
def test_a_malformed_answer_ends_in_one_line_naming_what_was_wrong(embedding_server, kind, phrase, tmp_path, capsys):
    embedding_server.malformed_next, embedding_server.malformed = 1, kind
    fails_in_one_line(api_eval(embedding_server, tmp_path), capsys, "api model 'tiny-shapes-clip'", phrase,
                      work=tmp_path)
    assert embedding_server.requests == 1 or kind == "dims"  # a first answer has no dimension to compare with


@pytest.mark.parametrize("env_name", [None, "MY_EMBEDDINGS_KEY"])
def test_a_missing_key_ends_in_one_line_before_any_request(embedding_server, env_name, tmp_path, capsys,
                                                           monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    extra = ["--api_key_env", env_name] if env_name else []
    fails_in_one_line(api_eval(embedding_server, tmp_path, *extra), capsys, "no API key",
                      env_name or "OPENAI_API_KEY", work=tmp_path)
    assert embedding_server.requests == 0


def test_a_changed_model_behind_the_same_name_stops_the_run(embedding_server, tmp_path, capsys):
    assert cli(api_eval(embedding_server, tmp_path, "--api_revision", "r1", out="before"), capsys)[0] == 0
    embedding_server.changed = True
    before = embedding_server.requests
    err = fails_in_one_line(api_eval(embedding_server, tmp_path, "--api_revision", "r1", limit=12), capsys,
                            "api model 'tiny-shapes-clip' at revision 'r1'", "has changed", "--api_revision",
                            work=tmp_path)
    assert "cosine" in err and embedding_server.requests - before == 1  # the image canary, nothing else
    code, _ = cli(api_eval(embedding_server, tmp_path, "--api_revision", "r1"), capsys)  # cached: nothing asked
    assert code == 0 and embedding_server.requests - before == 1
    code, err = cli(api_eval(embedding_server, tmp_path, "--api_revision", "r2", limit=12), capsys)
    assert code == 0, err  # the new model under a new revision: cached apart
    assert len(list((tmp_path / "cache" / "api_canaries").glob("*.json"))) == 2


# -- resume after a kill ---------------------------------------------------------------------------------------------
def image_digest(image) -> str:
    return hashlib.sha256(image.convert("RGB").tobytes()).hexdigest()


def test_a_killed_encode_resumes_without_asking_again_for_what_it_stored(embedding_server, tmp_path):
    from clipcache.tasks.datasets import open_dataset
    from clipcache.tasks.models.api_canaries import canary_image

    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("CLIPCACHE_FAULT", "PREFECT_API_URL"))},
           "OPENAI_API_KEY": KEY, "CLIPCACHE_CHUNK_ROWS": "10", "CLIPCACHE_COMMIT_SECONDS": "600",
           "PREFECT_HOME": str(tmp_path / "prefect")}
    # batches of 16 rows, commits every 10: the second commit (30 rows) ends inside the second batch
    argv = api_eval(embedding_server, tmp_path, "--batch_size", "16", "--api_concurrency", "4", limit=60)
    killed = subprocess.run([str(CLI), *argv], env={**env, "CLIPCACHE_FAULT": "encode-commit:2"}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    [progress] = (tmp_path / "cache" / "embeddings").glob("*.partial.zarr/progress.json")
    committed = json.loads(progress.read_text())["rows"]
    assert committed == 30
    embedding_server.reset()
    done = subprocess.run([str(CLI), *argv], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ds = open_dataset("shapes", None, "test", 60)

    asked = Counter(d for d in embedding_server.image_digests if d != image_digest(canary_image()))
    assert asked == Counter(image_digest(ds.load_image(i)) for i in range(committed, 60))
    assert len(cost_lines(done.stderr)) == 1


# -- the plugin hook ---------------------------------------------------------------------------------------------------
class InputListFormat(RequestFormat):
    """Images as ``{"input": [{"image": url}, ...]}`` (several per request), texts as ``{"text": ...}`` items."""

    images_per_request = 4

    def text_request(self, model, texts, encoding_format):
        return {"model": model, "input": [{"text": t} for t in texts], "encoding_format": encoding_format}

    def image_request(self, model, image_urls, encoding_format):
        return {"model": model, "input": [{"image": u} for u in image_urls], "encoding_format": encoding_format}


@pytest.fixture
def input_list_format():
    API_FORMATS.register("input_list", InputListFormat)
    yield
    API_FORMATS._entries.pop("input_list")
    API_FORMATS._origin.pop("input_list")


def test_a_registered_request_format_is_used_and_keyed(embedding_server, input_list_format, tmp_path, capsys):
    code, err = cli(api_eval(embedding_server, tmp_path, "--api_format", "input_list", limit=12), capsys)
    assert code == 0, err
    assert Counter(embedding_server.kinds) == {"image": 1 + 3, "text": 1 + 2}  # 12 images 4 a request; 2 prompt batches
    local = ["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "12", "--output_dir",
             str(tmp_path / "local"), "--cache_dir", str(tmp_path / "local-cache"), *QUIET]
    assert cli(local, capsys)[0] == 0
    assert metrics(tmp_path / "out") == metrics(tmp_path / "local")


# -- fast: identity, flags, limits, answers ---------------------------------------------------------------------------
def test_identity_holds_model_revision_and_format_not_url_or_key(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    memo = FileHashMemo(tmp_path / "file_hashes.json")
    a = resolve_model(ModelSpec(model_name="api:m", api_base="http://127.0.0.1:1/v1"), memo)
    b = resolve_model(ModelSpec(model_name="api:m", api_base="https://other.example/v1/", api_concurrency=3), memo)
    assert a.identity == b.identity == {"loader": "api", "model": "m", "api_revision": today_revision(),
                                        "request_format": "openai"}
    assert a.checkpoint == f"api:m@{today_revision()}" and a.canary_dir == str(tmp_path / "api_canaries")
    c = resolve_model(ModelSpec(model_name="api:m", api_base="http://127.0.0.1:1/v1", api_revision="v2"), memo)
    assert c.identity["api_revision"] == "v2" and c.fingerprint != a.fingerprint
    assert KEY not in repr(a) + ModelSpec(model_name="api:m", api_base="http://h/v1").model_dump_json()


@pytest.mark.parametrize("argv,phrase", [
    (["--model", "tiny-shapes-clip", "--api_base", "http://127.0.0.1:1/v1"], "--api_base: only api: models take it"),
    (["--model", "api:m"], "needs the server's OpenAI-compatible base URL"),
    (["--model", "api:m", "--api_base", "localhost:8000"], "expected an http:// or https:// URL"),
    (["--model", "api:m", "--api_base", "http://h/v1", "--api_revision", "a b"], "not a plain version name"),
    (["--model", "api:m", "--api_base", "http://h/v1", "--api_key_env", "sk-live-123"], "NAME of an environment"),
    (["--model", "api:m", "--api_base", "http://h/v1", "--api_format", "opanai"], "Did you mean: openai"),
])
def test_bad_api_flags_are_one_line_before_any_work(argv, phrase, tmp_path, capsys):
    argv = ["eval", *argv, "--dataset", "shapes", "--output_dir", str(tmp_path / "out"), "--cache_dir",
            str(tmp_path / "cache"), *QUIET]
    err = fails_in_one_line(argv, capsys, phrase, work=tmp_path)
    assert "sk-live-123" not in err
    assert not (tmp_path / "cache").exists()


def test_api_flags_go_only_to_api_models_of_a_product(tmp_path):
    from clipcache.flows.cli.app import build_parser, params_from_args

    args = build_parser("eval").parse_args(["eval", "--model", "api:m", "tiny-shapes-clip", "--api_base",
                                            "http://h/v1", "--api_rpm", "40", "--dataset", "shapes"])
    api, local = params_from_args(args).models
    assert (api.api_base, api.api_rpm) == ("http://h/v1", 40) and (local.api_base, local.api_rpm) == (None, None)


def test_evalscope_model_entries_take_the_same_keys():
    from clipcache.flows.config.evalscope import to_evaluate_params

    cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": "api:m", "api_base": "http://h/v1", "api_revision": "2025-06-01", "api_tpm": 1000}],
        "dataset_name": ["shapes"]}}}
    [spec] = to_evaluate_params(cfg).models
    assert (spec.api_base, spec.api_revision, spec.api_tpm) == ("http://h/v1", "2025-06-01", 1000)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_an_evalscope_mteb_config_runs_an_api_model_with_its_key_in_memory_only(embedding_server, tmp_path,
                                                                                 monkeypatch):
    """evalscope's way to name an API embedding model in a RAGEval tool: mteb config (model_name, api_base, api_key):
    the local model's numbers on the same folder, the key reaches the server and no file."""
    from test_evalscope_configs import mteb_cfg, write_retrieval_folder

    from clipcache import run_task

    monkeypatch.delenv("OPENAI_API_KEY")  # the config's api_key is the only key
    folder = write_retrieval_folder(tmp_path / "data")
    cfg = mteb_cfg(folder, tmp_path, {"model_name": "tiny-shapes-clip", "api_base": embedding_server.api_base,
                                      "api_key": KEY})
    [ours] = run_task(cfg)
    assert embedding_server.authorizations and set(embedding_server.authorizations) == {f"Bearer {KEY}"}
    local = tmp_path / "local"
    code = main(["eval", "--model", "tiny-shapes-clip", "--task", "text_retrieval", "--dataset", "ShapesRetrieval",
                 "--dataset_root", str(folder), "--recall_k", "1", "3", "5", "10", "20", "100", "1000",
                 "--batch_size", "16", "--output_dir", str(local / "out"), "--cache_dir", str(local / "cache"),
                 *QUIET])
    assert code == 0
    theirs = metrics(local / "out")["ShapesRetrieval"]
    assert ours["metrics"].keys() == theirs.keys()
    for name, value in theirs.items():
        assert abs(ours["metrics"][name] - value) < 1e-6, name
    assert ours["model"].startswith("api:tiny-shapes-clip")
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or KEY.encode() not in path.read_bytes(), path


def test_requests_per_minute_are_spread_evenly():
    clock = FakeClock()
    limiter = RateLimiter(rpm=40, tpm=None, clock=clock, sleep=clock.sleep)  # MIEB's 40 images a minute
    for _ in range(41):
        limiter.acquire(0)
    assert clock.now == pytest.approx(60.0)  # 1 at once, then one every 1.5 s
    starts = []
    for _ in range(80):
        starts.append(clock.now)
        limiter.acquire(0)
    assert max(sum(1 for t in starts if s <= t < s + 60) for s in starts) <= 41


def test_tokens_per_minute_are_reserved_from_our_own_count():
    clock = FakeClock()
    limiter = RateLimiter(rpm=None, tpm=6000, clock=clock, sleep=clock.sleep)  # 100 tokens a second
    assert limiter.acquire(100) == 0  # one second's allowance at once
    assert limiter.acquire(300) == pytest.approx(3.0)
    assert limiter.acquire(100) == pytest.approx(1.0)  # what a server reports never corrects the bucket
    assert not hasattr(limiter, "correct")
    assert estimate_text_tokens(["abcd" * 10, ""]) == 11


def test_a_retry_after_holds_back_every_request():
    clock = FakeClock()
    limiter = RateLimiter(rpm=None, tpm=None, clock=clock, sleep=clock.sleep)
    limiter.hold(2.5)
    assert limiter.acquire(1) == pytest.approx(2.5) and limiter.acquire(1) == 0


def test_answers_are_read_in_index_order_as_floats_or_base64():
    import base64

    fmt = RequestFormat()
    rows = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    b64 = [base64.b64encode(r.astype("<f4").tobytes()).decode() for r in rows]
    body = {"data": [{"index": 1, "embedding": b64[1]}, {"index": 0, "embedding": rows[0].tolist()}],
            "usage": {"prompt_tokens": 7, "total_tokens": 7}}
    vectors, tokens = fmt.parse(body, 2)
    assert vectors.dtype == np.float32 and (vectors == rows).all() and tokens == 7
    assert fmt.parse({"data": [{"embedding": [1.0]}]}, 1)[1] is None
    for bad, phrase in [({"object": "error"}, "no 'data' list"), ({"data": [{"embedding": "!!"}]}, "not base64"),
                        ({"data": [{"embedding": "AAAAAA=="}]}, "all zeros"),
                        ({"data": [{"embedding": "AAAA"}]}, "3 bytes is not a float32 vector"), ({"data": [{"embedding": None}]}, "NoneType"),
                        ({"data": [{"index": 3, "embedding": [1.0]}]}, "index")]:
        with pytest.raises(MalformedResponse, match=phrase):
            fmt.parse(bad, 1)


def test_concurrent_jobs_stop_at_the_first_failure():
    from clipcache.storage.errors import ModelError
    from clipcache.tasks.models.api_client import ApiClient
    from clipcache.tasks.models.api_spec import ApiSettings

    client = ApiClient(ApiSettings(api_base="http://127.0.0.1:9", concurrency=4), "k", "/embeddings", "m")
    started = []
    lock = threading.Lock()

    def job(i):
        def run(stop):
            with lock:
                started.append(i)
            if i == 0:
                raise ModelError("first fails")
            stop.wait(5)
            return i
        return run

    t = time.monotonic()
    with pytest.raises(ModelError, match="first fails"):
        client.run_all([job(i) for i in range(20)])
    assert time.monotonic() - t < 2 and len(started) <= 8
    assert client.run_all([lambda stop, i=i: i for i in range(5)]) == [0, 1, 2, 3, 4]
    client.close()
