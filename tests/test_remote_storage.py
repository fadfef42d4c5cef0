"""cache_dir and output_dir as fsspec URLs: an S3 API served by moto on 127.0.0.1, and fsspec's memory filesystem."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.paths import as_path, is_remote, local_dir


def _object_keys(endpoint: str, bucket: str) -> list[str]:
    import boto3

    pages = boto3.client("s3", endpoint_url=endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_urls_become_remote_paths_and_local_paths_stay_local(tmp_path):
    assert not is_remote(as_path(tmp_path))
    assert not is_remote(as_path(f"file://{tmp_path}"))
    assert is_remote(as_path("memory://bucket/cache"))
    assert local_dir(str(tmp_path)) == tmp_path
    assert not is_remote(local_dir("memory://bucket/cache"))


def test_entry_written_in_place_is_invisible_until_published_and_resumes(tmp_path):
    root = f"memory://store-{uuid.uuid4().hex[:8]}"
    store = EmbeddingStore(root)
    fields = {"role": "image", "n": 1}
    rows = np.random.default_rng(0).standard_normal((5000, 8)).astype(np.float32)
    with store.writer(fields, "image", capacity=len(rows)) as writer:
        writer.add(rows[:4200], np.arange(4200))  # commits one 4096-row chunk, keeps the rest buffered
        key = writer.key
    # the "crash": 4096 rows committed, nothing published
    assert not store.has(key) and store.keys() == [] and store.partial_keys() == [key]
    with store.writer(fields, "image", capacity=len(rows)) as writer:
        assert writer.start_position == 4096 and writer.resumed
        writer.add(rows[4096:], np.arange(4096, 5000))
        writer.finish()
    assert store.has(key) and store.keys() == [key] and store.partial_keys() == []
    entry = store.open(key, fields)
    np.testing.assert_array_equal(entry.embeddings(), rows)
    assert store.verify(key) == []
    assert store.remove(key) > 0 and not store.has(key)


@pytest.mark.slow
def test_evaluate_with_cache_and_results_on_s3(prefect_server, s3_endpoint, bucket, tmp_path, monkeypatch,
                                               capsys):
    """The whole pipeline against S3: embeddings, evalscope JSON and Parquet go to the bucket, DuckDB queries them
    there, and a second run reads the cached embeddings back from S3 without loading the model."""
    import clipcache
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate

    monkeypatch.setenv("CLIPCACHE_LOCAL_DIR", str(tmp_path / "local"))
    base = {"models": [{"model_name": "tiny-shapes-clip"}], "datasets": ["shapes", "shapes_retrieval"], "limit": 96,
            "batch_size": 32, "verbose": False}
    remote = EvaluateParams(**base, cache_dir=f"s3://{bucket}/cache", output_dir=f"s3://{bucket}/results")
    local = EvaluateParams(**base, cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "out"))

    first = evaluate(remote)
    expected = evaluate(local)
    assert [r.metrics for r in first] == [r.metrics for r in expected]
    assert first[0].model_loaded and not any(r.cache_hit for r in first)

    keys = _object_keys(s3_endpoint, bucket)
    assert any(k.startswith("cache/embeddings/") and k.endswith(".zarr/zarr.json") for k in keys)
    assert "results/tiny-shapes-clip/shapes_zeroshot_classification.limit96.json" in keys
    assert any(k.startswith("results/warehouse/metrics/") for k in keys)
    assert not any(".partial" in k or k.endswith("progress.json") for k in keys)

    second = evaluate(remote)
    assert all(r.cache_hit and not r.model_loaded for r in second)
    assert [r.metrics for r in second] == [r.metrics for r in first]

    con = clipcache.connect(f"s3://{bucket}/results")
    runs = con.sql("SELECT count(*) FROM runs WHERE status = 'completed'").fetchall()[0][0]
    acc1 = con.sql("SELECT value FROM metrics WHERE dataset = 'shapes' AND metric = 'acc' AND k = 1 LIMIT 1").fetchall()[0][0]
    assert runs == 2 and acc1 == pytest.approx(expected[0].metrics["acc1"])

    store = EmbeddingStore(f"s3://{bucket}/cache")
    assert store.keys() and all(store.verify(k) == [] for k in store.keys())
    from clipcache.flows.cli import main

    capsys.readouterr()
    assert main(["cache", "--cache_dir", f"s3://{bucket}/cache", "ls"]) == 0
    listing = capsys.readouterr().out
    assert all(k[:12] in listing for k in store.keys())
    assert main(["cache", "--cache_dir", f"s3://{bucket}/cache", "verify"]) == 0
    payload = json.loads(as_path(f"s3://{bucket}/results/tiny-shapes-clip/shapes_zeroshot_classification.limit96.json")
                         .read_text())
    assert payload["metrics"]["acc1"] == pytest.approx(expected[0].metrics["acc1"])


def test_local_only_commands_name_the_field_for_urls(capsys):
    from clipcache.flows.cli import main

    assert main(["report", "--output_dir", "s3://bucket/results"]) == 2
    err = capsys.readouterr().err
    assert "output_dir: " in err and "must be a local folder" in err and "Traceback" not in err


def test_reads_on_s3_refresh_last_used_and_gc_keeps_what_was_read_in_its_window(s3_endpoint, bucket, tmp_path,
                                                                                 monkeypatch, capsys):
    import time

    from clipcache.flows.cli import main

    monkeypatch.setenv("CLIPCACHE_LOCAL_DIR", str(tmp_path / "local"))
    cache, out = f"s3://{bucket}/cache", f"s3://{bucket}/results"
    base = ["--model", "tiny-shapes-clip", "--limit", "16", "--cache_dir", cache, "--output_dir", out, "--quiet"]
    assert main(["eval", *base, "--dataset", "shapes", "shapes_retrieval"]) == 0
    store = EmbeddingStore(cache)
    written = {k: store.last_used(k) for k in store.keys()}
    # S3 gives whole seconds: 3 s apart, a re-read entry's time is 3 s later (> written + 2), and what the eval wrote
    # is at least 3 s older than the window below, which adds 2 s for the two roundings
    time.sleep(3)
    started = time.time()
    assert main(["rescore", *base, "--dataset", "shapes"]) == 0  # reads the shapes entries (and the prompt pool)
    read = {k for k in store.keys() if store.last_used(k) > written[k] + 2}
    assert read and read != set(written)
    capsys.readouterr()
    # a window that holds the whole rescore, however slow this machine is just now, and not the eval before it
    window = int(time.time() - started) + 2
    assert main(["cache", "--cache_dir", cache, "gc", "--older_than", f"{window}s"]) == 0
    assert set(EmbeddingStore(cache).keys()) == read  # what was read within the window is kept, the rest freed


def test_a_missing_bucket_is_one_line(s3_endpoint, tmp_path, monkeypatch, capsys):
    from clipcache.flows.cli import main

    monkeypatch.setenv("CLIPCACHE_LOCAL_DIR", str(tmp_path / "local"))
    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "4", "--quiet",
                 "--cache_dir", "s3://no-such-bucket-here/cache", "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0 and "no-such-bucket-here" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "warehouse" / "metrics").exists()
