"""Zero-shot classification metrics, defined exactly as LAION clip_benchmark defines them.

Inputs are L2-normalised float32 embeddings read from the cache. Tie rule: see :mod:`tasks.score.ranking` (equal
logits are ordered by ascending class index, as a stable sort does).
"""

from __future__ import annotations

import math

import numpy as np

# clip_benchmark multiplies logits by 100 before ranking them. A positive constant does not change any ordering in
# exact arithmetic; we keep it so float32 rounding of the logits, and therefore any exact ties, is the same too.
LOGIT_SCALE = np.float32(100.0)


def zero_shot_classifier(prompt_embeddings: np.ndarray, n_classes: int, n_templates: int) -> np.ndarray:
    """(dim, n_classes) classifier from class-major prompt embeddings (row = class * n_templates + template).

    For each class: the template embeddings (already L2-normalised) are averaged and the average is L2-normalised.
    """
    dim = prompt_embeddings.shape[1]
    per_class = prompt_embeddings.reshape(n_classes, n_templates, dim).astype(np.float32, copy=False)
    mean = per_class.mean(axis=1, dtype=np.float32)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    return np.ascontiguousarray(mean.T)


def logits(image_embeddings: np.ndarray, classifier: np.ndarray) -> np.ndarray:
    return LOGIT_SCALE * (image_embeddings.astype(np.float32, copy=False) @ classifier)


def true_class_rank(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """0-based rank of each sample's true class among all classes (0 = the top logit)."""
    true = logits[np.arange(len(logits)), targets][:, None]
    cols = np.arange(logits.shape[1])[None, :]
    return ((logits > true).sum(axis=1) + ((logits == true) & (cols < targets[:, None])).sum(axis=1)).astype(np.int64)


def accuracy_at_k(logits: np.ndarray, targets: np.ndarray, k: int) -> float:
    """Fraction of samples whose true class is among the ``k`` highest logits (denominator: all samples)."""
    if len(targets) == 0:
        return math.nan
    return float((true_class_rank(logits, targets) < k).mean())


def mean_per_class_recall(logits: np.ndarray, targets: np.ndarray) -> float:
    """Balanced accuracy of the argmax: the mean, over classes present in ``targets``, of per-class recall.

    Same as sklearn's ``balanced_accuracy_score(targets, argmax)``; classes never present in the targets do not count.
    """
    if len(targets) == 0:
        return math.nan
    pred = logits.argmax(axis=1)  # first maximum = lowest class index, the tie rule
    classes = np.unique(targets)
    recalls = [(pred[targets == c] == c).mean() for c in classes]
    return float(np.mean(recalls))


def average_precision_per_class(logits: np.ndarray, multi_hot: np.ndarray) -> np.ndarray:
    """AP per class: mean of precision@rank over the ranks of the positives (0 for a class with no positive).

    float32 throughout, as clip_benchmark (torchnet's APMeter) computes it; results agree to float32 rounding.
    """
    n, n_classes = logits.shape
    order = np.argsort(-logits, axis=0, kind="stable")
    truth = np.take_along_axis(multi_hot.astype(bool), order, axis=0)
    precision = np.cumsum(truth, axis=0, dtype=np.float32) / np.arange(1, n + 1, dtype=np.float32)[:, None]
    positives = truth.sum(axis=0)
    return (precision * truth).sum(axis=0, dtype=np.float32) / np.maximum(positives, 1).astype(np.float32)


def mean_average_precision(logits: np.ndarray, multi_hot: np.ndarray) -> float:
    return float(average_precision_per_class(logits, multi_hot).mean(dtype=np.float32))


def classification_metrics(logits: np.ndarray, targets: np.ndarray, n_classes: int) -> dict[str, float]:
    """acc1, acc5 (NaN below 5 classes, as clip_benchmark) and mean_per_class_recall; mAP for multi-hot targets."""
    if targets.ndim == 2:
        return {"mean_average_precision": mean_average_precision(logits, targets)}
    acc5 = accuracy_at_k(logits, targets, 5) if n_classes >= 5 else math.nan
    return {
        "acc1": accuracy_at_k(logits, targets, 1),
        "acc5": acc5,
        "mean_per_class_recall": mean_per_class_recall(logits, targets),
    }
