"""Brute-force NumPy references of the group metrics, for the tests: the package computes them once, in SQL (the
dbt models' SQL, which the warehouse's views and the evaluation run: storage/sql_rules.py), and these direct loops
over the definitions (DataComp's, WILDS', scikit-learn's macro F1) check its numbers and the bootstrap's draws."""

from __future__ import annotations

from typing import Any

import numpy as np

from clipcache.storage.sample_metadata import SampleMetadata
from clipcache.tasks.suites.face_attributes import head_metrics


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


def outcome(spec: dict[str, Any], prediction: np.ndarray, truth: np.ndarray | None) -> np.ndarray:
    """Each sample's 0/1 outcome under ``spec``'s rule (see the module's docstring)."""
    prediction = np.asarray(prediction, np.int64)
    if spec["rule"] == "equals" and truth is not None:
        return (prediction == truth).astype(np.float64)
    if spec["rule"] == "not_class" and truth is not None:
        return ((prediction != spec["class"]).astype(np.int64) == truth).astype(np.float64)
    if spec["rule"] == "range":
        high = spec.get("high")
        return ((prediction >= spec["low"]) & ((prediction < high) if high is not None else True)).astype(np.float64)
    raise ValueError(f"face metric {spec['metric']!r}: unknown rule {spec['rule']!r} (or no truth field)")


def group_name(by: list[str], codes: tuple[int, ...]) -> str:
    """WILDS' group_field_str: ``field:code`` per field, last field first, joined by ``_``."""
    return "_".join(f"{f}:{c}" for f, c in reversed(list(zip(by, codes, strict=True))))


def _outcomes(spec: dict[str, Any], positions: np.ndarray, predictions: dict[str, np.ndarray],
              metadata: SampleMetadata) -> tuple[np.ndarray, np.ndarray]:
    """(each sample's outcome under ``spec``, its group key: one code per ``by`` field)."""
    truth = metadata.codes[spec["truth"]][positions] if spec.get("truth") else None
    values = outcome(spec, predictions[spec["head"]], truth)
    return values, np.stack([metadata.codes[f][positions] for f in spec["by"]], axis=1)


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
