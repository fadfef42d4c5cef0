"""mieb_linear_probe: MIEB's own linear-probe protocol over cached features equals mteb's ImageClassification
evaluation (CIFAR10's 16 samples per label, 5 experiments) run on the same embeddings, raw (normalised row x stored
norm, what mteb's CLIP-style wrappers give) or normalised; the picks are mteb's; the per-experiment sample rows
recompute every stored score; an entry without norms is one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one, get_task
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.evaluation.common import open_single_label
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.progress import StageProgress
from clipcache.tasks.score.mieb_probe import SCORES, experiment_picks, experiment_scores, summarise

from conftest import write_wds


@pytest.fixture(scope="module")
def probe_data(tmp_path_factory):
    """A classification set in the webdataset layout, train and test splits, 10 classes."""
    root = tmp_path_factory.mktemp("wds") / "probe"
    for split, n, seed in (("train", 240, 1), ("test", 60, 3)):
        write_wds(root, "classification", n, shards=1, split=split, fmt="png", n_classes=10, seed=seed)
    return root


@pytest.fixture(scope="module")
def run(probe_data, tmp_path_factory):
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"), False,
                           "fp32")
    store = EmbeddingStore(tmp_path_factory.mktemp("cache"))

    def evaluate(**options):
        return evaluate_one("mieb_linear_probe", session, DataSource("wds/probe", str(probe_data)), store, memo,
                            encode=EncodeSettings(32, 1), options=options)

    return evaluate, store


def mteb_evaluation(root, store, raw: bool):
    """mteb's own CIFAR10 ImageClassification `_evaluate_subset` on the same images, its encoder answering with the
    cached vectors of each image (found by its pixels)."""
    import datasets
    import mteb
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.timing import TimingStack

    by_pixels, splits = {}, {}
    for split in ("train", "test"):
        data = open_single_label("mieb_linear_probe", DataSource("wds/probe", str(root), split=split),
                                 StageProgress(enabled=False))
        [entry] = [store.open(k) for k in store.keys() if store.open(k).attrs["key_fields"].get("split") == split]
        vectors = entry.raw_embeddings("test") if raw else entry.embeddings()
        images = [data.load_image(i) for i in range(len(data))]
        for image, vector in zip(images, vectors, strict=True):
            by_pixels[image.size, image.tobytes()] = vector
        splits[split] = datasets.Dataset.from_dict({"img": images, "label": [int(x) for x in data.labels]},
                                                   features=datasets.Features({"img": datasets.Image(),
                                                                               "label": datasets.Value("int64")}))

    class CachedEncoder(AbsEncoder):
        def __init__(self):
            pass

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            return np.stack([by_pixels[image.size, image.convert("RGB").tobytes()]
                             for batch in inputs for image in batch["image"]])

    task = mteb.get_task("CIFAR10")
    assert (task.samples_per_label, task.n_experiments, task.seed) == (16, 5, 42)
    return task._evaluate_subset(CachedEncoder(), datasets.DatasetDict(splits), encode_kwargs={"batch_size": 32},
                                 hf_split="test", hf_subset="default", timer=TimingStack())


@pytest.mark.parametrize("features", ["raw", "normalized"])
def test_equal_to_mteb_image_classification_on_the_same_embeddings(run, probe_data, features):
    evaluate, store = run
    scored = evaluate(probe_features=features)
    theirs = mteb_evaluation(probe_data, store, raw=features == "raw")
    for name in SCORES:
        ours = scored.metrics[f"mieb_lp_{name}"]
        if name.startswith("ap"):  # ten classes: undefined both ways
            assert math.isnan(ours) and (theirs[name] is None or math.isnan(theirs[name])), name
        else:
            assert ours == theirs[name], name
    accuracies = [s["accuracy"] for s in theirs["scores_per_experiment"]]
    assert scored.metrics["mieb_lp_accuracy_std"] == float(np.std(accuracies))
    assert scored.metrics["mieb_lp_accuracy"] > 0.5 and scored.n_samples == 60  # far above chance (0.1)


def test_raw_and_normalised_features_give_other_probes(run):
    evaluate, _ = run
    raw, normalised = evaluate().metrics, evaluate(probe_features="normalized").metrics
    assert raw != normalised  # the norms change a logistic regression's regularised fit


def test_the_picks_are_mtebs_undersampling():
    import datasets
    import mteb

    labels = np.random.default_rng(0).integers(0, 4, 50)
    task = mteb.get_task("CIFAR10")
    task.samples_per_label = 3
    table = datasets.Dataset.from_dict({"label": labels.tolist()})
    expected, idxs = [], None
    for i in range(4):
        _, idxs, chosen = task._undersample_data(table, i, idxs)
        expected.append(list(chosen))
    assert experiment_picks(labels, 3, 4, 42) == expected
    assert len({tuple(p) for p in expected}) == 4 and all(len(p) == 12 for p in expected)


def test_sample_rows_recompute_every_score(run):
    evaluate, _ = run
    scored = evaluate(n_experiments=3)
    parts = scored.evidence.parts()
    assert [p.unit for p in parts] == ["image_experiment_0", "image_experiment_1", "image_experiment_2"]
    per_experiment = []
    for part in parts:
        columns = part.columns
        assert (columns["correct1"] == (columns["prediction"] == columns["target"])).all()
        assert columns["sample_index"].tolist() == list(range(60))
        per_experiment.append(experiment_scores(columns["target"], columns["prediction"]))
    recomputed = summarise(per_experiment)
    assert recomputed.keys() == scored.metrics.keys()
    for name, value in recomputed.items():
        assert value == scored.metrics[name] or (math.isnan(value) and math.isnan(scored.metrics[name]))


def test_hand_computed_scores():
    scores = experiment_scores(np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1]))
    assert scores["accuracy"] == 0.75 and scores["recall"] == 0.75  # (1/2 + 2/2) / 2
    assert scores["precision"] == pytest.approx((1 + 2 / 3) / 2) and scores["ap"] is not None
    assert summarise([{**scores, "accuracy": 0.5}, scores])["mieb_lp_accuracy_std"] == 0.125


def test_an_entry_without_norms_is_one_line_for_raw_features_and_fine_for_normalised(run, monkeypatch):
    from clipcache.storage.cache_entry import EmbeddingEntry

    evaluate, _ = run
    monkeypatch.setattr(EmbeddingEntry, "has_norms", property(lambda self: False))  # as written before norms
    monkeypatch.setattr(EmbeddingEntry, "has_raw", property(lambda self: False))  # (and before raw rows)
    with pytest.raises(CacheIntegrityError) as e:
        evaluate()
    assert len(str(e.value).splitlines()) == 1 and "mieb_linear_probe needs the raw features" in str(e.value)
    assert evaluate(probe_features="normalized").metrics["mieb_lp_accuracy"] > 0.5


def test_the_task_reads_the_image_entries_linear_probe_reads():
    task = get_task("mieb_linear_probe")
    assert task.serves("image", "classification") and not task.serves("image", "retrieval")
    assert task.Options().changed() == {} and task.Options(probe_features="normalized").changed() == {
        "probe_features": "normalized"}
