"""What a result is made of: per-sample outcomes and the metrics' bootstrap intervals, computed from those outcomes.

A task that keeps its samples returns an :class:`Evidence` with its scores; the results writer stores the samples as
rows of the warehouse's ``samples`` table and the intervals as ``ci_low`` / ``ci_high`` of the metric rows. Every
aggregate is recomputable from the sample rows (tests/test_evidence.py and tests/test_evidence_tasks.py recompute
each). What a row is, per task (its ``unit``) and which of ``SAMPLE_SCHEMA``'s columns it fills, each task declares
(``EvalTask.samples``; the results writer holds the evidence to it, and docs/results.md's table lists them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.tasks.score.intervals import (
    DEFAULT_RESAMPLES,
    Statistic,
    class_recall_statistic,
    interval,
    mean_statistic,
)

if TYPE_CHECKING:
    from clipcache.storage.sample_metadata import SampleMetadata

Interval = tuple[float | None, float | None]


@dataclass
class Evidence:
    unit: str  # what a row is: image (a classified image), caption, image_query, ...
    # SAMPLE_SCHEMA's columns, one NumPy array each; text columns (captioning's caption, reference_captions) are
    # lists of str and of lists of str
    columns: dict[str, Any]
    keys: list[str] | None = None  # the samples' own names, when the dataset has them
    intervals: dict[str, Interval] = field(default_factory=dict)  # flat metric name -> 95% interval
    # the experiment's rows of other units (retrieval: the image queries beside the text queries), each written as
    # rows of its own unit; their intervals are merged into the experiment's
    more: list[Evidence] = field(default_factory=list)
    # the dataset's per-sample metadata, written once per dataset identity (storage/sample_metadata.py); a part of
    # unit ``metadata`` among ``more`` names it for this experiment
    metadata: SampleMetadata | None = None

    def parts(self) -> list[Evidence]:
        return [self, *self.more]

    def all_intervals(self) -> dict[str, Interval]:
        merged: dict[str, Interval] = {}
        for part in self.parts():
            merged.update(part.intervals)
        return merged


def classification_evidence(samples: dict[str, np.ndarray], n_classes: int, *, resamples: int = DEFAULT_RESAMPLES,
                            seed: int = 0, keys: list[str] | None = None, prefix: str = "") -> Evidence:
    """Zero-shot classification (and, with ``prefix="lp_"``, the linear probe's test samples): acc1 / acc5 are means
    of topk's per-sample outcomes, mean per-class recall the balanced accuracy of the argmax; each gets a
    percentile-bootstrap interval over the images."""
    n = len(samples["target"])
    intervals: dict[str, Interval] = {}
    if resamples > 0 and n:
        intervals[f"{prefix}acc1"] = interval(mean_statistic(samples["correct1"]), n, resamples=resamples, seed=seed)
        if "correct5" in samples:
            intervals[f"{prefix}acc5"] = interval(mean_statistic(samples["correct5"]), n, resamples=resamples,
                                                  seed=seed)
        right = samples["prediction"] == samples["target"]
        intervals[f"{prefix}mean_per_class_recall"] = interval(class_recall_statistic(samples["target"], right,
                                                                                      n_classes),
                                                               n, resamples=resamples, seed=seed)
    return Evidence("image", samples, keys, intervals)


def multilabel_evidence(average_precision: np.ndarray, logits: np.ndarray, multi_hot: np.ndarray, *,
                        resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                        classnames: list[str] | None = None) -> Evidence:
    """Multilabel classification: one row per class (``sample_index`` and ``target``: the class, ``sample_key``:
    its name, ``value``: its average precision as the metric computed it, a float32 widened exactly).
    mean_average_precision is the float32 mean of ``value`` over the classes (torch's mean, as clip_benchmark
    takes it; a float64 ``avg(value)`` agrees to float32 rounding). Its interval resamples the images, the units
    the data was drawn in, not the classes (:func:`average_precision_statistic`)."""
    n_classes = len(average_precision)
    classes = np.arange(n_classes, dtype=np.int64)
    columns = {"sample_index": classes, "target": classes, "value": np.asarray(average_precision, np.float64)}
    intervals: dict[str, Interval] = {}
    if resamples > 0 and len(logits):
        intervals["mean_average_precision"] = interval(average_precision_statistic(logits, multi_hot), len(logits),
                                                       resamples=resamples, seed=seed)
    return Evidence("class", columns, classnames, intervals)


def average_precision_statistic(logits: np.ndarray, multi_hot: np.ndarray) -> Statistic:
    """Mean average precision on resamples of the images (rows of ``logits``, (images, classes)), AP defined as
    :func:`~clipcache.tasks.score.classification.average_precision_per_class` defines it: the mean of precision@rank
    over the ranks of the positives, 0 for a class without positives.

    Each class is ranked once (scores descending; a tie keeps image order). A resample is a count per image, and
    an image drawn w times holds w consecutive ranks after the ``a`` copies ranked above it, ``p`` of them
    positive; a positive image's copies then add ``sum_j (p + j) / (a + j) = w - (a - p) * (H(a + w) - H(a))``
    (H: harmonic numbers) to the precision sum. So a resample costs a gather and two cumulative sums per class,
    no sort."""
    scores = np.asarray(logits)
    truth = np.asarray(multi_hot) > 0
    n, n_classes = scores.shape
    order = np.argsort(-scores, axis=0, kind="stable")  # (images, classes): each class's ranking
    ranked_truth = np.take_along_axis(truth, order, axis=0)
    positives = [order[ranked_truth[:, c], c] for c in range(n_classes)]  # each class's positives, best first
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1))])

    def statistic(idx: np.ndarray) -> np.ndarray:
        b = len(idx)
        cells = (idx + n * np.arange(b)[:, None]).ravel()
        counts = np.bincount(cells, minlength=b * n).reshape(b, n).astype(np.int32)  # draws of each image
        total = np.zeros(b)
        for c in range(n_classes):
            # copies ranked down to each image's last copy
            through = np.cumsum(counts[:, order[:, c]], axis=1, dtype=np.int32)
            w = counts[:, positives[c]]
            if not w.shape[1]:
                continue  # no positive: AP 0
            last = through[:, ranked_truth[:, c]]
            above = last - w
            positives_above = np.cumsum(w, axis=1, dtype=np.int32) - w
            precision_sum = (w - (above - positives_above) * (harmonic[last] - harmonic[above])).sum(axis=1)
            total += precision_sum / np.maximum(w.sum(axis=1), 1)
        return total / n_classes

    return statistic


def selection_evidence(outcomes: dict[str, np.ndarray], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                       keys: list[str] | None = None) -> Evidence:
    """Image-caption selection: three rows per item, one per score (unit ``item``: the group score, what ``acc``
    averages; ``item_text``: text_acc; ``item_image``: image_acc), each with the item's outcome in ``correct1``,
    whether a tied maximum decided it in ``tied`` (the ``item`` rows' count is acc's ``tied_queries``) and its
    smallest margin in ``margin`` (see :func:`~clipcache.tasks.score.selection.selection_outcomes`). Each metric is
    the float32 mean of its rows' ``correct1``; intervals resample the items."""
    index = np.asarray(outcomes["sample_index"], np.int64)
    scores = {"item": ("acc", outcomes["text_right"] & outcomes["image_right"],
                       outcomes["text_tied"] | outcomes["image_tied"],
                       np.fmin(outcomes["text_margin"], outcomes["image_margin"])),
              **{f"item_{side}": (f"{side}_acc", outcomes[f"{side}_right"], outcomes[f"{side}_tied"],
                                  outcomes[f"{side}_margin"]) for side in ("text", "image")}}
    parts = []
    for unit, (metric, correct, tied, margin) in scores.items():
        intervals: dict[str, Interval] = {}
        if resamples > 0 and len(index):
            intervals[metric] = interval(mean_statistic(correct), len(index), resamples=resamples, seed=seed)
        parts.append(Evidence(unit, {"sample_index": index, "correct1": correct, "tied": tied, "margin": margin},
                              keys, intervals))
    return Evidence(parts[0].unit, parts[0].columns, keys, parts[0].intervals, more=parts[1:])


def clustering_evidence(labels: np.ndarray, clusters: np.ndarray, positions: np.ndarray, *,
                        keys: list[str] | None = None) -> Evidence:
    """Image clustering: one row per image, its class in ``target`` and its k-means cluster in ``prediction``;
    scikit-learn's ``normalized_mutual_info_score`` / ``adjusted_rand_score`` of (target, prediction) are the stored
    metrics exactly.

    No interval: a bootstrap over the images is not a sound one here. Drawing with replacement duplicates images,
    and a duplicate agrees with itself in both partitions, so every resample looks more clustered than the data
    (2,000 synthetic images of 50 classes, half of them clustered at random: NMI 0.456, a percentile interval of
    [0.499, 0.533] that misses it; tests/test_evidence_tasks.py); and the clusters would stay fixed while k-means,
    refitted on a resample, would move them."""
    columns = {"sample_index": np.asarray(positions, np.int64), "target": np.asarray(labels, np.int64),
               "prediction": np.asarray(clusters, np.int64)}
    return Evidence("image", columns, keys)
