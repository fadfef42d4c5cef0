"""The score stage end to end: ties reported in the table, the result JSON and the warehouse; and bad cache
entries: a non-finite embedding (images, captions or class prompts), an embedding dimension or a row count that does
not fit the dataset. Each is one line naming the entry and a remedy that works, a non-zero exit, and no metric row in
the warehouse. The entries are rewritten with valid seals, so only the score stage's own
checks can catch them."""

from __future__ import annotations

import re
import shlex

import numpy as np
import pyarrow.parquet as pq
import pytest

from clipcache.flows.cli import main
from clipcache.storage.cache_keys import AuxSpec
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.naming import path_component


def rewrite(store: EmbeddingStore, key: str, change) -> None:
    """Replace entry ``key`` by ``change``(its arrays) under the same key, sealed as the writer seals."""
    entry = store.open(key)
    fields, kind, meta = entry.attrs["key_fields"], entry.kind, dict(entry.meta)
    lengths = entry.attrs.get("lengths", {})
    arrays = {name: entry.array(name) for name in entry.array_names()}
    change(arrays, meta)
    store.remove(key)
    per_row = [n for n in arrays if n not in ("embeddings", "position", "norms", "raw") and n not in lengths]
    aux = {n: AuxSpec(str(arrays[n].dtype), tuple(arrays[n].shape[1:])) for n in per_row}
    with store.writer(fields, kind, capacity=len(arrays["embeddings"]), aux=aux) as w:
        w.add(arrays["embeddings"], arrays["position"], arrays.get("norms"), arrays.get("raw"),
              **{n: arrays[n] for n in per_row})
        w.finish(meta=meta, extra_arrays={n: arrays[n] for n in lengths})


def entry_of(store: EmbeddingStore, role: str) -> str:
    return next(k for k in store.keys() if store.open(k).attrs["key_fields"].get("role") == role)


def nan_row(arrays, meta):
    arrays["embeddings"][3, 0] = np.nan


def inf_row(arrays, meta):
    arrays["embeddings"][0, 1] = np.inf


def other_dim(arrays, meta):
    for name in ("embeddings", "raw"):  # an entry that keeps the model's raw rows keeps them at its width
        if name in arrays:
            arrays[name] = np.ascontiguousarray(arrays[name][:, :-8])


def other_count(arrays, meta):
    meta["n_samples"] = int(meta.get("n_samples", len(arrays["embeddings"]))) + 7


CASES = {
    "nan-image": ("shapes", "image", nan_row, "non-finite embedding"),
    "inf-caption": ("shapes_retrieval", "caption", inf_row, "non-finite embedding"),
    "nan-prompt": ("shapes", "prompt-batch", nan_row, "non-finite class prompt embedding"),
    "caption-dim": ("shapes_retrieval", "caption", other_dim, "dimensions"),
    "prompt-dim": ("shapes", "prompt-batch", other_dim, "dimensions"),
    "image-count": ("shapes", "image", other_count, "samples"),
}


@pytest.mark.full  # end to end: an eval, a rescore and the remedy per case
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_entry_is_one_line_and_writes_no_metric(case, tmp_path, capsys):
    dataset, role, change, message = CASES[case]
    base = ["--model", "tiny-shapes-clip", "--dataset", dataset, "--limit", "60", "--output_dir",
            str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), "--quiet"]
    assert main(["eval", *base]) == 0
    metrics = tmp_path / "out" / "warehouse" / "metrics"
    rows_before = pq.read_table(metrics).num_rows
    store = EmbeddingStore(tmp_path / "cache")
    rewrite(store, entry_of(store, role), change)
    capsys.readouterr()
    code = main(["rescore", *base])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert message in err and "cache" in err, err
    assert pq.read_table(metrics).num_rows == rows_before  # nothing new in the warehouse
    # the remedy the line suggests works when followed: the next eval re-encodes and scores
    remedies = re.findall(r"`clipcache (cache [^`]+)`", err)
    assert remedies, err
    for remedy in remedies:  # as printed: it names this (non-default) cache itself
        argv = shlex.split(remedy)
        assert "--cache_dir" in argv and main(argv) == (1 if "verify" in argv else 0)
    assert main(["eval", *base]) == 0
    assert pq.read_table(metrics).num_rows > rows_before


@pytest.mark.parametrize("k", ["0", "-3"])
def test_k_below_one_is_one_line(k, tmp_path, capsys):
    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes_retrieval", "--recall_k", k,
                 "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "recall_k" in err, err
    assert not (tmp_path / "out" / "warehouse" / "metrics").exists()


@pytest.mark.full
def test_ties_reach_the_table_the_json_and_the_warehouse(tmp_path, capsys):
    """Repeated captions tie exactly: the table grows a ties column, and the counts are queryable."""
    import json

    import duckdb

    from conftest import write_wds

    root = write_wds(tmp_path / "ties", "retrieval", 300, shards=1, fmt="png")
    out = tmp_path / "out"
    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "wds/ties", "--dataset_root", str(root),
                 "--output_dir", str(out), "--cache_dir", str(tmp_path / "cache")])
    table = capsys.readouterr().out
    assert code == 0
    header = next(line for line in table.splitlines() if "metric" in line and "value" in line)
    assert "ties" in header and "decided by torch.topk" in table
    result = json.loads(next(out.rglob(f"{path_component('wds/ties')}_zeroshot_retrieval.json")).read_text())
    tied = duckdb.sql(f"SELECT sum(tied_queries) FROM read_parquet('{out}/warehouse/metrics/**/*.parquet')").fetchall()
    assert tied[0][0] > 0 and sum(result["tied_queries"].values()) == tied[0][0]


def test_a_mistyped_cache_dir_is_an_error_not_an_empty_cache(tmp_path, capsys):
    for argv in (["cache", "--cache_dir", str(tmp_path / "cahce"), "verify"],
                 ["cache", "verify", "--cache_dir", str(tmp_path / "cahce")],
                 ["cache", "ls", "--cache_dir", str(tmp_path / "cahce")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "cahce does not exist" in err, err
