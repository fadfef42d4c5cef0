"""Linear probe over cached features: clip_benchmark's own probe code (its CUDA-only `evaluate`, run here with the
device swapped to the CPU) gives the same numbers on the same features; the test split's features are zero-shot
classification's cache entry; other probe settings encode nothing; bad settings are one line."""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest
import torch
from clip_benchmark.metrics import linear_probe as cb_linear_probe

from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, ScoreSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

from conftest import write_wds


@pytest.fixture(scope="module")
def probe_data(tmp_path_factory):
    """A classification set in the webdataset layout with train, val and test splits (10 classes)."""
    root = tmp_path_factory.mktemp("wds") / "probe"
    for split, n, seed in (("train", 240, 1), ("val", 80, 2), ("test", 120, 3)):
        write_wds(root, "classification", n, shards=1, split=split, fmt="png", n_classes=10, seed=seed)
    return root


def ours(root, cache, **probe):
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"), False,
                           "fp32")
    store = EmbeddingStore(cache)
    scored = evaluate_one("linear_probe", session, DataSource("wds/probe", str(root)), store, memo,
                          encode=EncodeSettings(32, 2), score=ScoreSettings(batch_size=32),
                          options={"batch_size": 32, **probe})
    return scored.metrics, store


def features_of(store, split):
    for key in store.keys():
        entry = store.open(key)
        if entry.attrs["key_fields"].get("split") == split and entry.kind == "image":
            return torch.from_numpy(entry.embeddings()), torch.from_numpy(entry.array("target")).long()
    raise AssertionError(f"no {split} entry")


def clip_benchmark_probe(store, tmp_path, monkeypatch, fewshot_k, lr, epochs, seed, with_val):
    """clip_benchmark's `linear_probe.evaluate` on the same features: written where it caches its own features, so
    it starts from them; `.cuda()` is the identity on this CPU machine (its code asserts CUDA)."""
    feature_dir = tmp_path / "features" / "probe"
    feature_dir.mkdir(parents=True)
    for split in ("train", "test") + (("val",) if with_val else ()):
        x, y = features_of(store, split)
        torch.save(x, feature_dir / f"features_{split}.pt")
        torch.save(y, feature_dir / f"targets_{split}.pt")
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self, raising=False)
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    infer = cb_linear_probe.infer
    monkeypatch.setattr(cb_linear_probe, "infer", lambda model, loader, amp, device: infer(model, loader, amp, "cpu"))
    torch.manual_seed(seed)  # what clipcache's pick is drawn after (clip_benchmark: after loading its model)
    return cb_linear_probe.evaluate(None, None, None, fewshot_k, 32, 0, lr, epochs, "probe", seed,
                                    str(tmp_path / "features"), "cuda", val_dataloader=object() if with_val else None,
                                    normalize=True, amp=False)


@pytest.mark.full  # end to end: encodes train and test splits
@pytest.mark.parametrize("fewshot_k, with_val", [(-1, False), (4, False), (-1, True)])
def test_the_probe_equals_clip_benchmarks_own_code_on_the_same_features(probe_data, tmp_path, monkeypatch,
                                                                         fewshot_k, with_val):
    settings = {"fewshot_k": fewshot_k, "fewshot_lr": 0.1, "fewshot_epochs": 4 if with_val else 10, "seed": 3}
    metrics, store = ours(probe_data, tmp_path / "cache", **settings, **({"val_split": "val"} if with_val else {}))
    theirs = clip_benchmark_probe(store, tmp_path, monkeypatch, fewshot_k, 0.1, settings["fewshot_epochs"], 3,
                                  with_val)
    assert metrics["lp_acc1"] == theirs["lp_acc1"]
    assert metrics["lp_acc5"] == theirs["lp_acc5"]
    assert metrics["lp_mean_per_class_recall"] == pytest.approx(theirs["lp_mean_per_class_recall"], abs=1e-12)
    assert 0.3 < metrics["lp_acc1"] <= 1.0  # a real probe, far above chance (0.1)
    again, _ = ours(probe_data, tmp_path / "cache", **settings, **({"val_split": "val"} if with_val else {}))
    assert again == metrics  # deterministic


@pytest.mark.full  # end to end: encodes train and test splits
def test_the_probe_reads_zero_shot_entries_and_other_settings_encode_nothing(probe_data, tmp_path, capsys):
    base = ["--model", "tiny-shapes-clip", "--dataset", "wds/probe", "--dataset_root", str(probe_data),
            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), "--quiet"]
    assert main(["eval", *base]) == 0  # zero-shot classification: the test split's image entry
    store = EmbeddingStore(tmp_path / "cache")
    before = set(store.keys())
    assert main(["eval", *base, "--task", "linear_probe"]) == 0
    added = set(store.keys()) - before
    assert [store.open(k).attrs["key_fields"]["split"] for k in added] == ["train"]  # test features reused
    # another learning rate, few-shot k and seed: a what-if from the cache alone
    assert main(["rescore", *base, "--task", "linear_probe", "--fewshot_lr", "0.05", "--fewshot_k", "5",
                 "--seed", "1"]) == 0
    assert set(store.keys()) == before | added
    rows = pq.read_table(tmp_path / "out" / "warehouse" / "metrics").to_pylist()
    probes = [r for r in rows if r["task"] == "linear_probe"]
    assert {(r["metric"], r["k"]) for r in probes} == {("lp_acc", 1), ("lp_acc", 5), ("lp_mean_per_class_recall",
                                                                                        None)}
    assert len({r["experiment_id"] for r in probes}) == 2  # the what-if is its own experiment ...
    options = {json.loads(r["task_options"]).get("fewshot_k") for r in probes}
    assert options == {None, 5}  # ... with its settings as columns
    capsys.readouterr()
    assert main(["query", "select count(*) as n from leaderboard where task = 'linear_probe'", "--output_dir",
                 str(tmp_path / "out"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 3}]  # only the default probe is on the leaderboard


def test_several_fewshot_k_in_one_run_share_one_encode(probe_data, tmp_path, capsys):
    base = ["--model", "tiny-shapes-clip", "--dataset", "wds/probe", "--dataset_root", str(probe_data),
            "--task", "linear_probe", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"),
            "--quiet"]
    assert main(["eval", *base, "--fewshot_k", "2", "4", "-1"]) == 0
    out = capsys.readouterr().out
    assert "variant" in out and "fewshot_k=2" in out and "fewshot_k=-1" in out
    store = EmbeddingStore(tmp_path / "cache")
    assert sorted(store.open(k).attrs["key_fields"]["split"] for k in store.keys()) == ["test", "train"]
    rows = pq.read_table(tmp_path / "out" / "warehouse" / "metrics").to_pylist()
    by_k = {json.loads(r["task_options"]).get("fewshot_k", -1): r["experiment_id"] for r in rows}
    assert len(by_k) == 3 and len(set(by_k.values())) == 3  # one experiment per k
    run_ids = {r["run_id"] for r in rows}
    assert len(run_ids) == 1  # ... all in one run
    # each k alone gives the same numbers (from the cache: nothing is encoded)
    single = {}
    for k in (2, 4):
        assert main(["rescore", *base, "--fewshot_k", str(k), "--output_dir", str(tmp_path / f"out{k}")]) == 0
        single[k] = {(r["metric"], r["k"]): r["value"]
                     for r in pq.read_table(tmp_path / f"out{k}" / "warehouse" / "metrics").to_pylist()}
    for k in (2, 4):
        assert {(r["metric"], r["k"]): r["value"] for r in rows if r["experiment_id"] == by_k[k]} == single[k]
    # one bad k of several: one line, and no probe of the run is written
    code = main(["eval", *base, "--fewshot_k", "2", "500", "--output_dir", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "fewshot_k: 500 samples per class" in err, err
    assert not (tmp_path / "bad" / "warehouse" / "metrics").exists()


@pytest.mark.parametrize("extra, message", [
    (["--train_split", "nope"], "nope/nshards.txt is missing (available splits: test, train, val)"),
    (["--fewshot_k", "500"], "fewshot_k: 500 samples per class"),
    (["--val_split", "val", "--val_proportion", "0.2"], "give one of them"),
    (["--normalize", "False"], "normalize"),
    (["--val_proportion", "1.5"], "val_proportion"),
    (["--fewshot_k", "0"], "fewshot_k"),
])
def test_bad_probe_settings_are_one_line_and_write_nothing(probe_data, tmp_path, capsys, extra, message):
    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "wds/probe", "--dataset_root", str(probe_data),
                 "--task", "linear_probe", "--output_dir", str(tmp_path / "out"), "--cache_dir",
                 str(tmp_path / "cache"), "--quiet", *extra])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out" / "warehouse" / "metrics").exists()


def test_few_classes_have_no_acc5(tmp_path):
    from clipcache.tasks.score.linear_probe import ProbeSettings, linear_probe

    torch.manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(60, 8), dim=1)
    y = torch.arange(60) % 3
    metrics, weight_decay = linear_probe(x, y, x, y, ProbeSettings(lr=0.1, epochs=3, batch_size=16, fewshot_k=-1,
                                                                   seed=0))
    assert math.isnan(metrics["lp_acc5"]) and weight_decay == 0.0 and 0 <= metrics["lp_acc1"] <= 1


@pytest.mark.parametrize("n, proportion", [(100, 0.2), (37, 0.3), (5, 0.5)])
def test_held_out_split_is_torchs_random_split(n, proportion):
    from clipcache.tasks.score.linear_probe import held_out_split

    keep, held = held_out_split(n, proportion, seed=7)
    a, b = torch.utils.data.random_split(range(n), [1 - proportion, proportion], torch.Generator().manual_seed(7))
    assert keep.tolist() == list(a.indices) and held.tolist() == list(b.indices)


@pytest.mark.full  # end to end: encodes train and test splits
def test_image_clustering_reuses_zero_shot_entries_and_matches_sklearn(probe_data, tmp_path, capsys):
    import numpy as np
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    base = ["--model", "tiny-shapes-clip", "--dataset", "wds/probe", "--dataset_root", str(probe_data),
            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), "--quiet"]
    assert main(["eval", *base]) == 0
    store = EmbeddingStore(tmp_path / "cache")
    keys = set(store.keys())
    assert main(["rescore", *base, "--task", "image_clustering", "--seed", "2"]) == 0  # nothing new to encode
    assert set(store.keys()) == keys
    rows = {r["metric"]: r["value"] for r in pq.read_table(tmp_path / "out" / "warehouse" / "metrics").to_pylist()
            if r["task"] == "image_clustering"}
    x, y = features_of(store, "test")
    clusters = KMeans(n_clusters=len(np.unique(y.numpy())), n_init=10, random_state=2).fit_predict(x.numpy())
    assert rows == {"image_clustering_nmi": pytest.approx(normalized_mutual_info_score(y.numpy(), clusters)),
                    "image_clustering_ari": pytest.approx(adjusted_rand_score(y.numpy(), clusters))}
    assert rows["image_clustering_nmi"] > 0.3  # the tiny model's embeddings do group the classes


def test_a_probe_rescore_that_misses_names_the_eval_that_fills_it(probe_data, tmp_path, capsys):
    import shlex

    base = ["--model", "tiny-shapes-clip", "--dataset", "wds/probe", "--dataset_root", str(probe_data),
            "--task", "linear_probe", "--train_split", "val", "--limit", "40", "--cache_dir", str(tmp_path / "cache")]
    assert main(["rescore", *base, "--output_dir", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    command = err.split("Fill it with:")[1].strip().splitlines()[0]
    assert "--task linear_probe" in command and "--train_split val" in command
    assert main([*shlex.split(command)[1:], "--output_dir", str(tmp_path / "out"), "--quiet"]) == 0  # as printed
    assert main(["rescore", *base, "--output_dir", str(tmp_path / "out"), "--quiet"]) == 0  # now all cached
