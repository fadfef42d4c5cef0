"""Classification metrics: hand-computed cases, ties, fewer than 5 classes, and clip_benchmark's own code as the
brute-force reference on seeded random data."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from clip_benchmark.metrics import zeroshot_classification as cb
from sklearn.metrics import balanced_accuracy_score

from clipcache.tasks.score.classification import (
    accuracy_at_k,
    average_precision_per_class,
    classification_metrics,
    mean_average_precision,
    mean_per_class_recall,
    zero_shot_classifier,
)


def test_hand_computed_accuracy_and_balanced_recall():
    logits = np.array([
        [0.9, 0.1, 0.0],   # true 0 -> rank 0
        [0.2, 0.5, 0.3],   # true 2 -> rank 1
        [0.1, 0.2, 0.7],   # true 1 -> rank 1
        [0.3, 0.6, 0.1],   # true 1 -> rank 0
    ], dtype=np.float32)
    targets = np.array([0, 2, 1, 1])
    assert accuracy_at_k(logits, targets, 1) == 0.5
    assert accuracy_at_k(logits, targets, 2) == 1.0
    # per-class recall: class0 1/1, class1 1/2, class2 0/1 -> mean 0.5
    assert mean_per_class_recall(logits, targets) == pytest.approx(0.5)


def test_fewer_than_five_classes_gives_nan_acc5():
    logits = np.eye(3, dtype=np.float32)
    m = classification_metrics(logits, np.array([0, 1, 2]), n_classes=3)
    assert m["acc1"] == 1.0 and math.isnan(m["acc5"]) and m["mean_per_class_recall"] == 1.0


def test_k_larger_than_classes_counts_every_sample():
    logits = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32)
    assert accuracy_at_k(logits, np.array([0, 1, 2, 0, 1, 2, 0]), 10) == 1.0


def test_tied_logits_are_resolved_as_clip_benchmark_resolves_them():
    """Duplicate class names give identical classifier columns, hence exactly tied logits: torch.topk decides, as in
    clip_benchmark, and argmax takes the first maximum."""
    rng = np.random.default_rng(3)
    logits = np.round(rng.normal(size=(300, 12)), 1).astype(np.float32)  # many exact ties
    logits[:, 7] = logits[:, 2]  # a duplicated class
    targets = rng.integers(0, 12, size=300)
    ref_acc1, ref_acc5 = cb.accuracy(torch.from_numpy(logits), torch.from_numpy(targets), topk=(1, 5))
    ours = classification_metrics(logits, targets, 12)
    assert (ours["acc1"], ours["acc5"]) == (ref_acc1, ref_acc5)
    tied = np.array([[0.5, 0.5, 0.5]], dtype=np.float32)
    assert mean_per_class_recall(tied, np.array([0])) == 1.0  # argmax picks the first of the tied maxima


def test_one_sample():
    logits = np.array([[0.1, 0.9, 0.3, 0.2, 0.0, 0.4]], dtype=np.float32)
    m = classification_metrics(logits, np.array([2]), n_classes=6)
    assert m == {"acc1": 0.0, "acc5": 1.0, "mean_per_class_recall": 0.0}


def test_classes_absent_from_targets_do_not_count_in_balanced_recall():
    logits = np.array([[1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]], dtype=np.float32)
    targets = np.array([0, 0, 1])  # classes 2 and 3 never occur; 3 is predicted once
    assert mean_per_class_recall(logits, targets) == pytest.approx((0.5 + 1.0) / 2)
    assert mean_per_class_recall(logits, targets) == pytest.approx(balanced_accuracy_score(targets, logits.argmax(1)))


@pytest.mark.parametrize("seed", range(5))
def test_against_clip_benchmark_on_random_logits(seed):
    rng = np.random.default_rng(seed)
    n, c = 200, int(rng.integers(5, 40))
    logits = rng.normal(size=(n, c)).astype(np.float32)
    targets = rng.integers(0, c, size=n)
    ref_acc1, ref_acc5 = cb.accuracy(torch.from_numpy(logits), torch.from_numpy(targets), topk=(1, 5))
    ours = classification_metrics(logits, targets, c)
    assert ours["acc1"] == ref_acc1 and ours["acc5"] == ref_acc5
    assert ours["mean_per_class_recall"] == pytest.approx(balanced_accuracy_score(targets, logits.argmax(1)), abs=1e-12)


def test_average_precision_hand_computed():
    # one class; ranking by score: pos, neg, pos, neg -> precisions at positives 1/1, 2/3 -> AP = 5/6
    logits = np.array([[0.9], [0.8], [0.7], [0.1]], dtype=np.float32)
    truth = np.array([[1], [0], [1], [0]])
    assert average_precision_per_class(logits, truth)[0] == pytest.approx(5 / 6)
    # a class with no positive counts as 0
    logits2 = np.concatenate([logits, logits], axis=1)
    truth2 = np.concatenate([truth, np.zeros_like(truth)], axis=1)
    assert mean_average_precision(logits2, truth2) == pytest.approx(5 / 12)


@pytest.mark.parametrize("seed", range(4))
def test_average_precision_against_clip_benchmark(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(150, 12)).astype(np.float32)
    truth = (rng.random((150, 12)) < 0.15).astype(np.int64)
    truth[:, 3] = 0  # a class without positives
    ref = cb.average_precision_per_class(torch.from_numpy(logits), torch.from_numpy(truth)).numpy()
    np.testing.assert_array_equal(average_precision_per_class(logits, truth).numpy(), ref)


def test_zero_shot_classifier_matches_clip_benchmark_definition():
    rng = np.random.default_rng(0)
    n_classes, n_templates, dim = 4, 3, 8
    raw = rng.normal(size=(n_classes * n_templates, dim)).astype(np.float32)
    normed = torch.nn.functional.normalize(torch.from_numpy(raw), dim=-1)  # what the cache stores
    ours = zero_shot_classifier(normed, n_classes, n_templates)
    for c in range(n_classes):
        emb = torch.nn.functional.normalize(torch.from_numpy(raw[c * n_templates:(c + 1) * n_templates]), dim=-1)
        ref = emb.mean(dim=0)
        ref /= ref.norm()
        np.testing.assert_array_equal(ours[:, c].numpy(), ref.numpy())
