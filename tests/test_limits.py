"""A limit that truncates nothing is the full experiment (the evalscope example's `limit: 1000` on a small set)."""

from __future__ import annotations

import json

from clipcache.flows.cli import main
from clipcache.storage.warehouse import connect

from conftest import write_image_queries

BASE = ["--model", "tiny-shapes-clip", "--quiet", "--orchestrator", "local"]


def run(tmp_path, *extra: str) -> None:
    root = tmp_path / "q" / "text-image-retrieval"
    if not root.exists():
        write_image_queries(tmp_path / "q", n=10)
    assert main(["eval", *BASE, "--dataset", "custom", "--dataset_root", str(root), "--output_dir",
                 str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), *extra]) == 0


def experiment_ids(tmp_path) -> list[tuple]:
    con = connect(tmp_path / "out")
    return con.sql("SELECT DISTINCT experiment_id, sample_limit FROM metrics ORDER BY 1").fetchall()


def test_a_limit_above_the_sample_count_is_the_full_experiment(tmp_path):
    run(tmp_path, "--limit", "1000")
    folder = tmp_path / "out" / "tiny-shapes-clip"
    assert [p.name for p in folder.iterdir()] == ["custom_zeroshot_retrieval.json"]
    saved = json.loads((folder / "custom_zeroshot_retrieval.json").read_text())
    assert "limit" not in saved and saved["experiment"]["sample_limit"] is None
    run(tmp_path)  # the unlimited run: same experiment, a cache hit
    [(experiment, limit)] = experiment_ids(tmp_path)
    assert experiment == saved["experiment_id"] and limit is None
    board = connect(tmp_path / "out").sql("SELECT count(DISTINCT run_id) FROM leaderboard").fetchall()
    assert board == [(1,)]  # one row per experiment: the latest run
    assert len(list((tmp_path / "cache" / "embeddings").glob("*.zarr"))) == 2  # images and captions, once


def test_a_limit_equal_to_the_sample_count_is_full_and_one_less_is_not(tmp_path):
    run(tmp_path, "--limit", "10")
    run(tmp_path, "--limit", "9")
    assert sorted(str(limit) for _, limit in experiment_ids(tmp_path)) == ["9", "None"]
    names = sorted(p.name for p in (tmp_path / "out" / "tiny-shapes-clip").iterdir())
    assert names == ["custom_zeroshot_retrieval.json", "custom_zeroshot_retrieval.limit9.json"]
