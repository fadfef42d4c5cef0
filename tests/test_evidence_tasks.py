"""Per-sample rows of multilabel classification, the linear probe, image-caption selection and image clustering:
each task run end to end writes rows from which every stored aggregate recomputes exactly, with intervals (none
with --bootstrap 0, none by design for clustering); the builders on hand-computed cases; a failed run's rows never
reach the `samples` view."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from clipcache import connect
from clipcache.flows.cli import main
from clipcache.tasks.score.classification import average_precision_per_class, balanced_recall
from clipcache.tasks.score.evidence import (
    average_precision_statistic,
    classification_evidence,
    clustering_evidence,
    multilabel_evidence,
    selection_evidence,
)
from clipcache.tasks.score.linear_probe import ProbeSettings, probe
from clipcache.tasks.score.selection import selection_metrics, selection_outcomes

from conftest import image_bytes, write_wds

CLASSNAMES_ML = 30  # write_wds's multilabel set: 30 classes


def write_winoground(root, n=12):
    """The hub repository's layout of Winoground (a test Parquet file), with every fourth item's captions swapped
    so that items fail both ways."""
    from clipcache.tasks.datasets import shapes

    ds = shapes.load_shapes("fixture", "zeroshot_retrieval", "test", 2 * n)
    first = [ds.captions[2 * i][0] for i in range(n)]
    second = [ds.captions[2 * i + 1][0] for i in range(n)]
    for i in range(3, n, 4):
        first[i], second[i] = second[i], first[i]
    table = pa.table({"id": [100 + i for i in range(n)],
                      "image_0": [image_bytes(ds.load_image(2 * i), "png") for i in range(n)],
                      "image_1": [image_bytes(ds.load_image(2 * i + 1), "png") for i in range(n)],
                      "caption_0": first, "caption_1": second})
    (root / "data").mkdir(parents=True)
    pq.write_table(table, root / "data" / "test-00000-of-00001.parquet")
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("evidence")
    for split, n, shards in (("train", 100, 1), ("test", 60, 2)):
        write_wds(root / "probe", "classification", n, shards=shards, split=split, fmt="png", n_classes=10,
                  seed=1)
    write_wds(root / "ml", "multilabel", 40, shards=1, fmt="jpg")
    write_winoground(root / "winoground")
    write_wds(root / "one", "classification", 6, shards=1, fmt="png", n_classes=1)
    return root


def cli(root, command, out, *args):
    code = main([command, "--model", "tiny-shapes-clip", "--dataset_root", str(root / "{dataset_cleaned}"),
                 "--output_dir", str(root / out), "--cache_dir", str(root / "cache"), "--quiet",
                 "--orchestrator", "local", *args])
    return code


RUNS = [["--dataset", "wds/ml", "winoground"],  # --task auto: multilabel classification, image-caption selection
        ["--dataset", "wds/probe", "--task", "linear_probe", "--fewshot_epochs", "5"],
        ["--dataset", "wds/probe", "--task", "image_clustering"]]


@pytest.fixture(scope="module")
def runs(data):
    for args in RUNS:
        assert cli(data, "eval", "out", *args) == 0
    return connect(str(data / "out"))


def metric_rows(con, task):
    rows = con.execute("SELECT metric, k, value, ci_low, ci_high, tied_queries, experiment_id FROM metrics "
                       "WHERE task = ?", [task]).fetchall()
    return {(m, k): {"value": v, "ci": (lo, hi), "tied": t, "experiment": e} for m, k, v, lo, hi, t, e in rows}


def sample_rows(con, task, unit):
    table = con.sql("SELECT * FROM latest_samples WHERE task = ? AND unit = ? ORDER BY sample_index",
                    params=[task, unit]).to_arrow_table()
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def inside(row):
    low, high = row["ci"]
    return low is not None and low <= row["value"] <= high


def test_multilabel_class_rows_recompute_mean_average_precision(runs):
    [row] = metric_rows(runs, "zeroshot_classification").values()
    s = sample_rows(runs, "zeroshot_classification", "class")
    assert s["sample_index"].tolist() == list(range(CLASSNAMES_ML)) == s["target"].tolist()
    assert s["sample_key"][0] == "red circle"  # the class's name
    # the float32 mean of the class rows, as the metric takes it (clip_benchmark's APMeter), exactly
    assert float(torch.tensor(s["value"].tolist(), dtype=torch.float32).mean()) == row["value"]
    assert runs.execute("SELECT avg(value) FROM samples WHERE unit = 'class'").fetchall()[0][0] == \
        pytest.approx(row["value"], abs=1e-7)
    assert inside(row) and row["ci"][1] - row["ci"][0] > 0


def test_probe_rows_recompute_every_metric(runs):
    rows = metric_rows(runs, "linear_probe")
    s = sample_rows(runs, "linear_probe", "image")
    assert len(s["sample_index"]) == 60 and s["sample_key"][0] == "0.tar/s000000"  # shard and webdataset key
    assert s["correct1"].mean() == rows[("lp_acc", 1)]["value"]
    assert s["correct5"].astype(bool).mean() == rows[("lp_acc", 5)]["value"]
    recall = balanced_recall(torch.from_numpy(s["prediction"].astype(np.int64)),
                             torch.from_numpy(s["target"].astype(np.int64)))
    assert recall == rows[("lp_mean_per_class_recall", None)]["value"]
    assert all(inside(r) for r in rows.values())
    top = np.stack(s["top"])
    assert top.shape == (60, 5) and (s["correct1"] == (top[:, 0] == s["target"])).all()
    assert ((s["rank"] == 1) | ~s["correct1"].astype(bool)).all()


def test_selection_rows_recompute_text_image_and_group_scores(runs):
    rows = metric_rows(runs, "image_caption_selection")
    scores = {"item": "acc", "item_text": "text_acc", "item_image": "image_acc"}
    for unit, metric in scores.items():
        s = sample_rows(runs, "image_caption_selection", unit)
        assert s["sample_index"].tolist() == list(range(12)) and s["sample_key"][0] == "100"  # Winoground's id
        stored = rows[(metric, None)]
        # clip_benchmark averages in float32: the float32 mean of the rows' outcomes, exactly
        assert float(torch.tensor(s["correct1"].tolist(), dtype=torch.float32).mean()) == stored["value"]
        assert runs.execute("SELECT avg(correct1::DOUBLE)::FLOAT FROM latest_samples WHERE unit = ?",
                            [unit]).fetchall()[0][0] == stored["value"]
        assert inside(stored)
    group = sample_rows(runs, "image_caption_selection", "item")
    text, image = (sample_rows(runs, "image_caption_selection", u) for u in ("item_text", "item_image"))
    assert (group["correct1"] == (text["correct1"] & image["correct1"])).all()
    assert not group["correct1"][3::4].any()  # the swapped items fail
    assert int(group["tied"].sum()) == (rows[("acc", None)]["tied"] or 0)
    assert ((group["margin"] > 0) == group["correct1"]).all()


def test_clustering_rows_recompute_nmi_and_ari_with_sklearn(runs):
    rows = metric_rows(runs, "image_clustering")
    s = sample_rows(runs, "image_clustering", "image")
    assert len(s["sample_index"]) == 60 and s["sample_key"][59] == "1.tar/s000059"
    assert normalized_mutual_info_score(s["target"], s["prediction"]) == rows[("image_clustering_nmi", None)]["value"]
    assert adjusted_rand_score(s["target"], s["prediction"]) == rows[("image_clustering_ari", None)]["value"]
    assert all(r["ci"] == (None, None) for r in rows.values())  # no interval, by design (clustering_evidence)


def test_bootstrap_0_writes_rows_without_intervals(runs, data):
    for args in RUNS:
        assert cli(data, "rescore", "out0", *args, "--bootstrap", "0") == 0
    con = connect(str(data / "out0"))
    rows = con.sql("SELECT task, metric, ci_low, ci_high FROM metrics").fetchall()
    assert {r[0] for r in rows} == {"zeroshot_classification", "image_caption_selection", "linear_probe",
                                    "image_clustering"}
    assert all(low is None and high is None for _, _, low, high in rows)
    units = con.sql("SELECT task, unit, count(*) FROM samples GROUP BY ALL ORDER BY ALL").fetchall()
    assert units == [("image_caption_selection", "item", 12), ("image_caption_selection", "item_image", 12),
                     ("image_caption_selection", "item_text", 12), ("image_clustering", "image", 60),
                     ("linear_probe", "image", 60), ("zeroshot_classification", "class", 30)]


def test_a_failed_runs_sample_rows_never_appear(runs, data):
    # the first dataset is scored and written, the second (one class) cannot be clustered: the run fails
    assert cli(data, "rescore", "failed", "--dataset", "wds/probe", "--task", "image_clustering") == 0
    assert cli(data, "eval", "failed", "--dataset", "wds/probe", "wds/one", "--task", "image_clustering") == 1
    con = connect(str(data / "failed"))
    [(failed,)] = con.sql("SELECT run_id FROM runs WHERE status = 'failed'").fetchall()
    written = pq.read_table(data / "failed" / "warehouse" / "samples").column("run_id").to_pylist()
    assert written.count(failed) == 60  # on disk, but not committed: no completed run row
    assert con.execute("SELECT count(*) FROM samples WHERE run_id = ?", [failed]).fetchall()[0][0] == 0
    assert con.execute("SELECT count(DISTINCT run_id), count(*) FROM samples").fetchall() == [(1, 60)]


# -- the builders on hand-computed cases --------------------------------------------------------------------------


def brute_force_map(logits, truth):
    """Mean AP in float64, straight from its definition (stable ranking; 0 for a class without positives)."""
    aps = []
    for c in range(logits.shape[1]):
        hits = truth[np.argsort(-logits[:, c], kind="stable"), c] > 0
        precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
        aps.append(precision[hits].sum() / max(hits.sum(), 1))
    return float(np.mean(aps))


def test_average_precision_statistic_hand_computed():
    logits = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.3], [0.1, 0.4]], dtype=np.float32)
    truth = np.array([[1, 0], [0, 0], [1, 0], [0, 0]])  # class 1 has no positive: AP 0
    statistic = average_precision_statistic(logits, truth)
    # identity: positives at ranks 1 and 3 -> (1/1 + 2/3) / 2; image 0 twice -> ranks 1, 2, 3 all positive -> 1;
    # image 1 first, image 2 twice -> (1/2 + 2/3) / 2
    draws = statistic(np.array([[0, 1, 2, 3], [0, 0, 2, 3], [1, 2, 2, 3]]))
    assert draws == pytest.approx([(1 + 2 / 3) / 2 / 2, 1 / 2, (1 / 2 + 2 / 3) / 2 / 2], abs=1e-15)
    ap = average_precision_per_class(logits, truth)
    evidence = multilabel_evidence(ap.numpy(), logits, truth, resamples=0, classnames=["cat", "dog"])
    assert evidence.unit == "class" and evidence.keys == ["cat", "dog"] and evidence.intervals == {}
    assert evidence.columns["value"].tolist() == pytest.approx([5 / 6, 0.0])


def test_average_precision_statistic_equals_the_definition_on_resamples():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 6)).astype(np.float32)
    truth = (rng.random((50, 6)) < 0.3).astype(np.uint8)
    truth[:, 5] = 0
    idx = rng.integers(0, 50, (40, 50))
    expected = [brute_force_map(logits[i], truth[i]) for i in idx]
    assert average_precision_statistic(logits, truth)(idx) == pytest.approx(expected, abs=1e-12)
    observed = float(average_precision_per_class(logits, truth).mean())
    low, high = multilabel_evidence(average_precision_per_class(logits, truth).numpy(), logits, truth,
                                    resamples=500).intervals["mean_average_precision"]
    assert low < observed < high


def test_probe_samples_are_what_its_metrics_count():
    torch.manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(80, 8), dim=1)
    y = torch.arange(80) % 8
    x[torch.arange(80), y] += 1.0  # separable enough for a few epochs
    settings = ProbeSettings(lr=0.1, epochs=5, batch_size=16, fewshot_k=-1, seed=0)
    result = probe(x, y, x, y, settings)
    s = result.samples
    assert s["correct1"].mean() == result.metrics["lp_acc1"] and s["correct5"].mean() == result.metrics["lp_acc5"]
    assert balanced_recall(torch.from_numpy(s["prediction"]), y) == result.metrics["lp_mean_per_class_recall"]
    evidence = classification_evidence({**s, "sample_index": np.arange(80)}, 8, prefix="lp_", resamples=200)
    assert set(evidence.intervals) == {"lp_acc1", "lp_acc5", "lp_mean_per_class_recall"}
    assert classification_evidence(s, 8, prefix="lp_", resamples=0).intervals == {}
    # three classes: no acc5, as clip_benchmark; a test class the training split lacks scores -inf
    train = y[y < 3]
    result = probe(x[y < 3], train, x[y < 4], y[y < 4], settings)
    s = result.samples
    assert "correct5" not in s and np.isnan(result.metrics["lp_acc5"])
    unseen = s["target"] == 3
    assert np.isneginf(s["score"][unseen]).all() and not s["correct1"][unseen].any()
    assert s["correct1"].mean() == result.metrics["lp_acc1"]


def unit_rows(rows):
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.norm(dim=-1, keepdim=True)


def test_selection_evidence_hand_computed():
    # tests/test_image_caption_selection.py's Winoground-style items: right both ways; image right but text wrong;
    # swapped (both wrong)
    images = unit_rows([[[1, 0], [0, 1]], [[1, 0], [0.9, 0.4]], [[0, 1], [1, 0]]])
    texts = unit_rows([[[1, 0], [0, 1]], [[1, 0], [0.2, 1]], [[1, 0], [0, 1]]])
    outcomes = selection_outcomes(images, texts)
    assert outcomes["text_right"].tolist() == [True, False, False]
    assert outcomes["image_right"].tolist() == [True, True, False]
    # item 0: each pair scores 1 against 0; item 2: each pair 0 against 1
    assert outcomes["text_margin"][[0, 2]].tolist() == pytest.approx([1.0, -1.0])
    assert outcomes["image_margin"][[0, 2]].tolist() == pytest.approx([1.0, -1.0])
    metrics, tied = selection_metrics(outcomes)
    evidence = selection_evidence({**outcomes, "sample_index": np.array([0, 1, 5])}, resamples=100, keys=list("abc"))
    by_unit = {part.unit: part for part in evidence.parts()}
    assert set(by_unit) == {"item", "item_text", "item_image"} and by_unit["item_image"].keys == list("abc")
    assert by_unit["item"].columns["correct1"].tolist() == [True, False, False]
    assert by_unit["item"].columns["sample_index"].tolist() == [0, 1, 5]
    for unit, metric in (("item", "acc"), ("item_text", "text_acc"), ("item_image", "image_acc")):
        correct = by_unit[unit].columns["correct1"]
        assert float(torch.tensor(correct.tolist(), dtype=torch.float32).mean()) == metrics[metric]
    assert set(evidence.all_intervals()) == {"acc", "text_acc", "image_acc"} and tied == 0
    # SugarCrepe's shape: one image, two captions; an exact tie is decided for the first caption
    one = selection_outcomes(unit_rows([[[1, 1]]]), unit_rows([[[1, 0], [0, 1]]]))
    assert one["text_right"].tolist() == [True] and one["text_tied"].tolist() == [True]
    assert one["text_margin"].tolist() == [0.0] and np.isnan(one["image_margin"]).all()  # no rival image
    assert selection_evidence({**one, "sample_index": np.array([0])}, resamples=0).all_intervals() == {}


def test_clustering_evidence_hand_computed():
    evidence = clustering_evidence(np.array([0, 0, 1, 1, 2]), np.array([1, 1, 0, 0, 0]), np.array([0, 1, 2, 4, 5]))
    assert evidence.unit == "image" and evidence.intervals == {} and evidence.keys is None
    c = evidence.columns
    assert c["sample_index"].tolist() == [0, 1, 2, 4, 5] and c["prediction"].tolist() == [1, 1, 0, 0, 0]
    assert adjusted_rand_score(c["target"], c["prediction"]) == pytest.approx(0.5454545454545454)


def test_why_clustering_has_no_bootstrap_interval():
    """clustering_evidence's reason: resampled images duplicate, duplicates agree with themselves, and the
    percentile interval of NMI misses the observed value."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 50, 2000)
    clusters = np.where(rng.random(2000) < 0.5, rng.integers(0, 50, 2000), (labels + 1) % 50)
    observed = normalized_mutual_info_score(labels, clusters)
    draws = [normalized_mutual_info_score(labels[i], clusters[i]) for i in rng.integers(0, 2000, (100, 2000))]
    low, high = np.percentile(draws, [2.5, 97.5])
    assert observed == pytest.approx(0.456, abs=1e-3) and 0.49 < low < high < 0.54  # the interval misses it


def test_sample_keys_name_each_sample_of_every_classification_layout(tmp_path, monkeypatch):
    """Where a dataset names its samples (files; VOC's objects by their box), each name is its sample's alone."""
    from clipcache.tasks.datasets import open_dataset
    from clipcache.tasks.datasets.clip_benchmark.layouts import layouts, task_of
    from tests.layout_fixtures import SPLITS, no_integrity_checks, write_layout

    no_integrity_checks(monkeypatch)
    named = []
    for name in sorted(n for n in layouts() if n in SPLITS and task_of(n) == "zeroshot_classification"):
        split = SPLITS[name][-1]
        ds = open_dataset(name, str(write_layout(name, tmp_path / name, split)), split, None)
        keys = [ds.sample_key(i) for i in range(len(ds))]
        if keys[0] is not None:
            named.append(name)
            assert all(isinstance(k, str) and not k.startswith("/") for k in keys), (name, keys[:3])
            assert len(set(keys)) == len(keys), (name, keys)
    assert {"voc2007", "voc2007_multilabel", "food101", "imagenet_sketch"} <= set(named)
