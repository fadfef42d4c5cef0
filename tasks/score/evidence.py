"""What a result is made of: per-sample outcomes and the metrics' bootstrap intervals, computed from those outcomes.

A task that keeps its samples returns an :class:`Evidence` with its scores; the results writer stores the samples as
rows of the warehouse's ``samples`` table and the intervals as ``ci_low`` / ``ci_high`` of the metric rows. Every
aggregate is recomputable from the sample rows (tests/test_evidence.py recomputes each).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from clipcache.tasks.score.intervals import DEFAULT_RESAMPLES, class_recall_statistic, interval, mean_statistic

Interval = tuple[float | None, float | None]


@dataclass
class Evidence:
    unit: str  # what a row is: image (a classified image), caption, image_query, ...
    columns: dict[str, np.ndarray]  # SAMPLE_SCHEMA's columns, one array each
    keys: list[str] | None = None  # the samples' own names, when the dataset has them
    intervals: dict[str, Interval] = field(default_factory=dict)  # flat metric name -> 95% interval
    # the experiment's rows of other units (retrieval: the image queries beside the text queries), each written as
    # rows of its own unit; their intervals are merged into the experiment's
    more: list[Evidence] = field(default_factory=list)

    def parts(self) -> list[Evidence]:
        return [self, *self.more]

    def all_intervals(self) -> dict[str, Interval]:
        merged: dict[str, Interval] = {}
        for part in self.parts():
            merged.update(part.intervals)
        return merged


def classification_evidence(samples: dict[str, np.ndarray], n_classes: int, *, resamples: int = DEFAULT_RESAMPLES,
                            seed: int = 0, keys: list[str] | None = None) -> Evidence:
    """Zero-shot classification: acc1 / acc5 are means of topk's per-sample outcomes, mean per-class recall the
    balanced accuracy of the argmax; each gets a percentile-bootstrap interval over the images."""
    n = len(samples["target"])
    intervals: dict[str, Interval] = {}
    if resamples > 0 and n:
        intervals["acc1"] = interval(mean_statistic(samples["correct1"]), n, resamples=resamples, seed=seed)
        if "correct5" in samples:
            intervals["acc5"] = interval(mean_statistic(samples["correct5"]), n, resamples=resamples, seed=seed)
        right = samples["prediction"] == samples["target"]
        intervals["mean_per_class_recall"] = interval(class_recall_statistic(samples["target"], right, n_classes), n,
                                                      resamples=resamples, seed=seed)
    return Evidence("image", samples, keys, intervals)
