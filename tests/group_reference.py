"""Brute-force NumPy references of the group metrics, for the tests: the package computes them once, in SQL (the
dbt models' SQL, which the warehouse's views and the evaluation run: storage/sql_rules.py), and these direct loops
over the definitions (DataComp's, WILDS', scikit-learn's macro F1) check its numbers and the bootstrap's draws."""

from __future__ import annotations

import numpy as np

from clipcache.storage.sample_metadata import SampleMetadata
from clipcache.tasks.suites.face_attributes import _outcomes, group_name, head_metrics


def macro_f1(target: np.ndarray, prediction: np.ndarray) -> float:
    """Mean over the classes present in ``target`` of 2 tp / (2 tp + fp + fn) = 2 tp / (predicted + support)."""
    target, prediction = np.asarray(target, np.int64), np.asarray(prediction, np.int64)
    if not len(target):
        return 0.0  # WILDS' Metric.compute on empty inputs
    classes = np.unique(target)
    size = int(max(target.max(), prediction.max())) + 1
    support = np.bincount(target, minlength=size)[classes]
    predicted = np.bincount(prediction, minlength=size)[classes]
    tp = np.bincount(target[target == prediction], minlength=size)[classes]
    return float(np.mean(2.0 * tp / (predicted + support)))


def group_accuracy(correct: np.ndarray, codes: np.ndarray) -> dict[int, tuple[int, float]]:
    """code -> (samples, mean of ``correct``) for every group with samples."""
    correct, codes = np.asarray(correct, np.float64), np.asarray(codes, np.int64)
    out = {}
    for code in np.unique(codes):
        mask = codes == code
        out[int(code)] = (int(mask.sum()), float(correct[mask].sum() / mask.sum()))
    return out


def worst_group(correct: np.ndarray, codes: np.ndarray) -> float:
    """The lowest per-group mean of ``correct`` over the groups with samples."""
    return min(acc for _, acc in group_accuracy(correct, codes).values())


def face_metrics(dataset: str, positions: np.ndarray, predictions: dict[str, np.ndarray],
                 metadata: SampleMetadata) -> dict[str, float]:
    """DataComp's FairFace / UTKFace metrics from each head's predictions for the samples at ``positions``."""
    positions = np.asarray(positions, np.int64)
    out: dict[str, float] = {}
    if not len(positions):
        return out
    for spec in head_metrics(dataset):
        values, keys = _outcomes(spec, positions, predictions, metadata)
        out[f"{spec['metric']}_avg"] = float(values.mean())
        per_group = {}
        for key in np.unique(keys, axis=0):
            mask = (keys == key).all(axis=1)
            per_group[group_name(spec["by"], tuple(int(k) for k in key))] = float(values[mask].mean())
        out.update({f"{spec['metric']}_{g}": v for g, v in per_group.items()})
        out[f"{spec['metric']}_wg"] = min(per_group.values())
    return out
