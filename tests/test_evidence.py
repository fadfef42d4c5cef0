"""Per-sample outcomes: every aggregate recomputes exactly from the sample rows, ties included, and the rows are small."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from clipcache.storage.results import write_sample_rows
from clipcache.tasks.score.classification import ClassificationCounts, balanced_recall
from clipcache.tasks.score.evidence import classification_evidence


def outcomes(logits: np.ndarray, targets: np.ndarray, batch: int = 32) -> tuple[dict, dict]:
    counts = ClassificationCounts(logits.shape[1], keep_samples=True)
    for lo in range(0, len(targets), batch):
        counts.add(torch.from_numpy(logits[lo:lo + batch]), torch.from_numpy(targets[lo:lo + batch]))
    return counts.metrics(), counts.samples()


@pytest.mark.parametrize("n_classes", [3, 10])
def test_metrics_recompute_exactly_from_samples_with_ties(n_classes):
    rng = np.random.default_rng(0)
    logits = rng.integers(0, 4, (300, n_classes)).astype(np.float32)  # many exact ties
    targets = rng.integers(0, n_classes, 300)
    metrics, samples = outcomes(logits, targets)
    assert samples["correct1"].mean() == metrics["acc1"]
    if n_classes >= 5:
        assert samples["correct5"].mean() == metrics["acc5"]
    else:
        assert "correct5" not in samples and np.isnan(metrics["acc5"])
    recall = balanced_recall(torch.from_numpy(samples["prediction"]), torch.from_numpy(samples["target"]))
    assert recall == metrics["mean_per_class_recall"]
    assert samples["tied"].any() and (samples["rank"] >= 1).all()


def test_sample_fields_hand_computed():
    logits = np.array([[0.1, 0.9, 0.5], [0.3, 0.3, 0.1], [0.2, 0.1, 0.7]], dtype=np.float32)
    targets = np.array([2, 1, 2])
    _, s = outcomes(logits, targets)
    assert s["rank"].tolist() == [2, 1, 1] and s["tied"].tolist() == [False, True, False]
    assert s["prediction"].tolist() == [1, 0, 2]  # argmax: the first maximum
    assert s["margin"] == pytest.approx([0.5 - 0.9, 0.0, 0.7 - 0.2])
    assert s["score"] == pytest.approx([0.5, 0.3, 0.7]) and s["top"].shape == (3, 1)


def test_classification_intervals_bracket_the_values():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2000, 20)).astype(np.float32)
    targets = rng.integers(0, 20, 2000)
    logits[np.arange(2000), targets] += 1.5
    metrics, samples = outcomes(logits, targets)
    evidence = classification_evidence(samples, 20)
    for name in ("acc1", "acc5", "mean_per_class_recall"):
        low, high = evidence.intervals[name]
        assert low < metrics[name] < high and high - low < 0.06
    assert classification_evidence(samples, 20, resamples=0).intervals == {}


def test_sample_rows_of_50000_images_are_small_and_read_back(tmp_path):
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((50_000, 100)).astype(np.float32)
    targets = rng.integers(0, 100, 50_000)
    _, samples = outcomes(logits, targets, batch=4096)
    path = write_sample_rows(tmp_path, "run1", created_at=datetime.now(UTC), experiment_id="exp1",
                             task="zeroshot_classification", unit="image", columns=samples)
    assert path.stat().st_size < 3 * 1024 * 1024, path.stat().st_size
    table = pq.read_table(path)
    assert table.num_rows == 50_000 and table.column("top").to_pylist()[7] == samples["top"][7].tolist()
    assert table.column("correct1").to_numpy().mean() == samples["correct1"].mean()
