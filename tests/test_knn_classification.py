"""knn_classification: cosine kNN over cached features equals scikit-learn's KNeighborsClassifier (uniform and
distance weights) on seeded random data and on the tiny model's cached features; hand-computed votes and ties; the
sample rows recompute both metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score import knn
from clipcache.tasks.score.knn import knn_metrics, knn_predict

from conftest import write_wds


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def sklearn_predict(train_x, train_y, test_x, k, weights):
    return KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute", weights=weights).fit(
        train_x, train_y).predict(test_x)


@pytest.mark.parametrize("weights", ["uniform", "distance"])
@pytest.mark.parametrize("k", [1, 4, 15])
def test_equal_to_sklearn_on_seeded_random_features(weights, k, monkeypatch):
    monkeypatch.setattr(knn, "BLOCK_ROWS", 7)  # several blocks
    rng = np.random.default_rng(k)
    train_x, test_x = unit(rng.normal(size=(90, 12))), unit(rng.normal(size=(40, 12)))
    train_y = rng.integers(0, 5, 90) * 3  # labels that are not 0..n-1
    ours = knn_predict(train_x, train_y, test_x, k=k, weights=weights)
    np.testing.assert_array_equal(ours, sklearn_predict(train_x, train_y, test_x, k, weights))


def test_hand_computed_votes_and_ties():
    train_x = unit(np.array([[1, 0], [1, 0.1], [0, 1], [0.1, 1]], np.float64))
    train_y = np.array([2, 2, 1, 1])
    test_x = unit(np.array([[1, 0.05], [1, 1]], np.float64))
    # k = 4: two votes each way; the smaller label wins the tie (as scikit-learn's mode)
    assert knn_predict(train_x, train_y, test_x, k=4, weights="uniform").tolist() == [1, 1]
    # distance weights: the near pair outvotes the far one for the first image; the second is equidistant
    assert knn_predict(train_x, train_y, test_x, k=4, weights="distance").tolist() == [2, 1]
    # a neighbour at distance 0 alone decides
    assert knn_predict(train_x, train_y, train_x[2:3], k=4, weights="distance").tolist() == [1]
    assert knn_metrics(np.array([0, 0, 1]), np.array([0, 1, 1])) == {"knn_acc1": 2 / 3,
                                                                     "knn_mean_per_class_recall": 0.75}
    with pytest.raises(DatasetError, match="knn_k: 5 neighbours asked, but the train split has 4"):
        knn_predict(train_x, train_y, test_x, k=5, weights="uniform")


def test_on_cached_features_equal_to_sklearn_and_rows_recompute(tmp_path):
    root = tmp_path / "probe"
    for split, n, seed in (("train", 120, 1), ("test", 40, 3)):
        write_wds(root, "classification", n, shards=1, split=split, fmt="png", n_classes=6, seed=seed)
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"), False,
                           "fp32")
    store = EmbeddingStore(tmp_path / "cache")
    scored = evaluate_one("knn_classification", session, DataSource("wds/probe", str(root)), store, memo,
                          encode=EncodeSettings(32, 1), options={"knn_k": 5, "knn_weights": "distance"})
    entries = {store.open(k).attrs["key_fields"]["split"]: store.open(k) for k in store.keys()}
    train, test = entries["train"], entries["test"]
    expected = sklearn_predict(train.embeddings(), train.array("target"), test.embeddings(), 5, "distance")
    columns = scored.evidence.columns
    np.testing.assert_array_equal(columns["prediction"], expected)
    assert scored.metrics == knn_metrics(columns["target"], columns["prediction"])
    assert scored.metrics["knn_acc1"] > 0.5 and scored.n_samples == 40
    low, high = scored.evidence.intervals["knn_acc1"]
    assert low <= scored.metrics["knn_acc1"] <= high
