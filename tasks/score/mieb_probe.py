"""MIEB's linear-probe protocol over cached image features, as mteb 2.x runs its ImageClassification tasks
(``AbsTaskClassification._evaluate_subset`` with ``SklearnEvaluator``; CIFAR10, Country211, DTD, ... set
``samples_per_label = 16`` and ``n_experiments = 5``):

- the training picks: for experiment ``i`` = 0, 1, ..., one list of the train rows, shuffled in place by a fresh
  ``np.random.RandomState(seed)`` (mteb's task seed, 42) each experiment *after* the previous experiments' shuffles
  (mteb carries the shuffled list over, so the experiments differ though the seed does not), then the first
  ``samples_per_label`` rows of each label in that order;
- the classifier: scikit-learn's ``LogisticRegression(max_iter=100, random_state=seed)`` fitted on those rows'
  features, predicting every test row;
- the scores of each experiment: scikit-learn's ``accuracy_score``, macro and weighted ``f1_score``,
  ``precision_score`` and ``recall_score`` of (test labels, predictions), and for two classes in the test labels
  ``average_precision_score`` of the predicted labels (macro and weighted); the reported score is the mean over the
  experiments (``np.mean``), and the spread here is their standard deviation (``np.std``, ddof 0).

The features are what mteb's encoder hands its evaluator: for the CLIP, OpenCLIP and SigLIP wrappers the raw
(unnormalised) features, here the cached normalised rows times their stored norms; ``normalized`` probes the rows
as cached.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from clipcache.storage.errors import DatasetError

SCORES = ("accuracy", "f1", "f1_weighted", "precision", "precision_weighted", "recall", "recall_weighted",
          "ap", "ap_weighted")
PREFIX = "mieb_lp_"


@dataclass(frozen=True)
class MiebProbeResult:
    metrics: dict[str, float]  # PREFIX + score (the mean over experiments) and PREFIX + score + "_std"
    predictions: np.ndarray  # (experiments, test rows): each experiment's predicted label of each test row
    picks: list[list[int]]  # each experiment's training rows


def experiment_picks(labels: np.ndarray, samples_per_label: int, n_experiments: int, seed: int) -> list[list[int]]:
    """The train rows each experiment fits on: mteb's ``_undersample_data``, experiment after experiment."""
    idxs = list(range(len(labels)))
    picks = []
    for _ in range(n_experiments):
        np.random.RandomState(seed).shuffle(idxs)  # the same seed each time, on the list the last one shuffled
        counts: dict[int, int] = defaultdict(int)
        chosen = []
        for i in idxs:
            label = int(labels[i])
            if counts[label] < samples_per_label:
                chosen.append(i)
                counts[label] += 1
        picks.append(chosen)
    return picks


def experiment_scores(y_test: np.ndarray, y_pred: np.ndarray) -> dict[str, float | None]:
    """One experiment's scores, mteb's ``_calculate_scores``: None for ap / ap_weighted unless two classes."""
    from sklearn.metrics import accuracy_score, average_precision_score, f1_score, precision_score, recall_score

    scores: dict[str, float | None] = {
        "accuracy": float(accuracy_score(y_test, y_pred)),
        "f1": float(f1_score(y_test, y_pred, average="macro")),
        "f1_weighted": float(f1_score(y_test, y_pred, average="weighted")),
        "precision": float(precision_score(y_test, y_pred, average="macro")),
        "precision_weighted": float(precision_score(y_test, y_pred, average="weighted")),
        "recall": float(recall_score(y_test, y_pred, average="macro")),
        "recall_weighted": float(recall_score(y_test, y_pred, average="weighted")),
        "ap": None, "ap_weighted": None,
    }
    if len(np.unique(y_test)) == 2:
        scores["ap"] = float(average_precision_score(y_test, y_pred, average="macro"))
        scores["ap_weighted"] = float(average_precision_score(y_test, y_pred, average="weighted"))
    return scores


def summarise(per_experiment: list[dict[str, float | None]]) -> dict[str, float]:
    """Mean (mteb's ``_calculate_avg_scores``: NaN where no experiment has the score) and standard deviation."""
    metrics: dict[str, float] = {}
    for name in SCORES:
        values = [v for s in per_experiment if (v := s[name]) is not None]
        metrics[PREFIX + name] = float(np.mean(values)) if values else float("nan")
        metrics[f"{PREFIX}{name}_std"] = float(np.std(values)) if values else float("nan")
    return metrics


def mieb_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, *,
               samples_per_label: int, n_experiments: int, seed: int, max_iter: int) -> MiebProbeResult:
    """Fit ``n_experiments`` logistic regressions on few-shot picks of the train features; score each on the test
    features."""
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(train_y)) < 2:
        raise DatasetError("mieb_linear_probe: the train split has fewer than 2 classes; a classifier needs two")
    picks = experiment_picks(train_y, samples_per_label, n_experiments, seed)
    predictions = np.empty((n_experiments, len(test_y)), dtype=np.int64)
    per_experiment = []
    for i, chosen in enumerate(picks):
        classifier = LogisticRegression(max_iter=max_iter, random_state=seed)
        classifier.fit(train_x[chosen], train_y[chosen])
        predictions[i] = classifier.predict(test_x)
        per_experiment.append(experiment_scores(test_y, predictions[i]))
    return MiebProbeResult(summarise(per_experiment), predictions, picks)
