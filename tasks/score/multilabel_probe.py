"""MIEB's multilabel image classification protocol over cached image features, as mteb 2.x runs VOC2007
(``AbsTaskMultilabelClassification._evaluate_subset``; VOC2007 keeps the base class's ``evaluator_model``, a
``KNeighborsClassifier(n_neighbors=5)``: its ``evaluator`` attribute naming a MultiOutputClassifier is not what the
evaluation fits; ``samples_per_label`` 8, ``n_experiments`` 5, the task seed 42, the whole test split):

- the label space: the classes present in the test labels (mteb fits its ``MultiLabelBinarizer`` on the test label
  lists; a train label absent from the test split is dropped, a test class absent from the train picks is a column
  of zeros);
- the training picks: one ``np.random.default_rng(seed)`` for the whole run; each experiment shuffles a fresh list
  ``0 .. n-1`` of the train rows with it (so the experiments differ), then walks that order and keeps a row when any
  of its labels has fewer than ``samples_per_label`` kept rows so far, counting every label of a kept row (a row
  without labels is never kept);
- the classifier: scikit-learn's ``KNeighborsClassifier(n_neighbors=k)`` (Euclidean, uniform votes) fitted on the
  picks' features and their binarised labels, one output per class, predicting every test row's label set;
- the scores of each experiment: ``accuracy`` (scikit-learn's subset accuracy: the predicted set is exactly the true
  one), ``lrap`` (``label_ranking_average_precision_score`` of the true sets against the 0/1 predictions, mteb's
  main score), ``f1`` (macro F1 over the classes) and ``hamming`` (mteb's: per image |true ∩ predicted| /
  |true ∪ predicted|, 1 when both are empty, averaged); reported: the mean over experiments (``np.mean``), and here
  also their standard deviation (``np.std``, ddof 0).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from clipcache.storage.errors import DatasetError

SCORES = ("lrap", "accuracy", "f1", "hamming")
PREFIX = "multilabel_"


@dataclass(frozen=True)
class MultilabelProbeResult:
    metrics: dict[str, float]  # PREFIX + score (mean over experiments) and PREFIX + score + "_std"
    predictions: np.ndarray  # (experiments, test rows, classes) 0/1, over ``classes``
    classes: np.ndarray  # the dataset's class indices the label space holds (those present in the test labels)
    picks: list[list[int]]  # each experiment's training rows
    hamming_rows: np.ndarray  # (experiments, test rows): each row's hamming score


def label_sets(multi_hot: np.ndarray) -> list[list[int]]:
    return [np.flatnonzero(row).tolist() for row in np.asarray(multi_hot)]


def experiment_picks(labels: list[list[int]], samples_per_label: int, n_experiments: int,
                     seed: int) -> list[list[int]]:
    """The train rows each experiment fits on: mteb's ``_undersample_data_indices``, experiment after experiment."""
    rng = np.random.default_rng(seed)  # the task's np_rng: one generator, advanced by every experiment
    picks = []
    for _ in range(n_experiments):
        idxs = list(np.arange(len(labels)))
        rng.shuffle(idxs)
        counts: dict[int, int] = defaultdict(int)
        chosen = []
        for i in idxs:
            row = labels[i]
            if any(counts[label] < samples_per_label for label in row):
                chosen.append(int(i))
                for label in row:
                    counts[label] += 1
        picks.append(chosen)
    return picks


def hamming_rows(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """Per row: |true ∩ predicted| / |true ∪ predicted|, 1.0 where both are empty (mteb's ``hamming_score``)."""
    true, pred = y_true.astype(bool), y_pred.astype(bool)
    inter, union = (true & pred).sum(axis=1), (true | pred).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union == 0, 1.0, inter / union)


def experiment_scores(y_test: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score, label_ranking_average_precision_score

    return {"lrap": float(label_ranking_average_precision_score(y_test, y_pred)),
            "accuracy": float(accuracy_score(y_test, y_pred)),
            "f1": float(f1_score(y_test, y_pred, average="macro")),
            "hamming": float(hamming_rows(y_test, y_pred).mean())}


def multilabel_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, *,
                     samples_per_label: int, n_experiments: int, seed: int, k: int) -> MultilabelProbeResult:
    """``train_y`` / ``test_y``: multi-hot rows over the dataset's classes."""
    from sklearn.neighbors import KNeighborsClassifier

    classes = np.flatnonzero(np.asarray(test_y).any(axis=0))
    if not len(classes):
        raise DatasetError("multilabel_probe: no test image has a label, so there is nothing to classify")
    y_test = np.asarray(test_y)[:, classes].astype(np.int64)
    y_train = np.asarray(train_y)[:, classes].astype(np.int64)
    picks = experiment_picks(label_sets(train_y), samples_per_label, n_experiments, seed)
    predictions = np.empty((n_experiments, *y_test.shape), dtype=np.int64)
    per_experiment = []
    for i, chosen in enumerate(picks):
        if len(chosen) < k:
            raise DatasetError(f"multilabel_probe: experiment {i} picked {len(chosen)} train images, fewer than the "
                               f"{k} neighbours asked (multilabel_knn_k); the train split has too few labelled "
                               f"images")
        classifier = KNeighborsClassifier(n_neighbors=k)
        classifier.fit(train_x[chosen], y_train[chosen])
        predictions[i] = np.asarray(classifier.predict(test_x)).reshape(y_test.shape)
        per_experiment.append(experiment_scores(y_test, predictions[i]))
    metrics: dict[str, float] = {}
    for name in SCORES:
        values = [s[name] for s in per_experiment]
        metrics[PREFIX + name] = float(np.mean(values))
        metrics[f"{PREFIX}{name}_std"] = float(np.std(values))
    hamming = np.stack([hamming_rows(y_test, p) for p in predictions])
    return MultilabelProbeResult(metrics, predictions, classes, picks, hamming)
