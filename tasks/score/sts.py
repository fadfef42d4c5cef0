"""Semantic textual similarity scored as mteb scores it (``AnySTSEvaluator`` and ``AbsTaskSTS._calculate_scores``,
mteb 2.x): MIEB's visual STS sets are STS pairs rendered as images, so the two sides are image embeddings.

For pairs ``(a_i, b_i)`` with gold similarity ``g_i``:

- similarities, with scikit-learn's paired functions on the raw features (normalised rows x their norms): ``cosine = 1 -
  paired_cosine_distances``, ``manhattan = -paired_manhattan_distances``, ``euclidean = -paired_euclidean_distances``;
- gold, normalised as mteb does: ``(g - MIN_SCORE) / (MAX_SCORE - MIN_SCORE)`` (0 and 5, mteb's defaults, which every
  MIEB visual STS task keeps; a correlation does not change with it, the bits do);
- ``<similarity>_pearson`` / ``<similarity>_spearman``: scipy's ``pearsonr`` / ``spearmanr`` of (normalised gold,
  similarity), float64 on the float32 similarities. ``cosine_spearman`` is MIEB's main score.

Constant gold (or constant similarities) makes a correlation undefined: NaN, as scipy and so mteb return it (stored
as null). One pair is an error in mteb (``pearsonr`` needs two); the task refuses it before encoding. mteb's
``pearson`` / ``spearman`` use the model's own similarity, cosine for every model clipcache runs: the cosine ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from clipcache.tasks.score.intervals import DEFAULT_RESAMPLES, Statistic, interval

MIN_SCORE, MAX_SCORE = 0, 5  # mteb AbsTaskSTS.min_score / max_score
SUB_BLOCK = 64  # resamples ranked at once: a few (64 x n) float64 arrays


def pair_similarities(first: np.ndarray, second: np.ndarray) -> dict[str, np.ndarray]:
    """The three similarities of each pair (rows of ``first`` and ``second``), as AnySTSEvaluator computes them."""
    from sklearn.metrics.pairwise import (
        paired_cosine_distances,
        paired_euclidean_distances,
        paired_manhattan_distances,
    )

    return {"cosine": 1 - paired_cosine_distances(first, second),
            "manhattan": -paired_manhattan_distances(first, second),
            "euclidean": -paired_euclidean_distances(first, second)}


def normalized_gold(gold: Sequence[float]) -> list[float]:
    """mteb's ``AbsTaskSTS._normalize`` of each gold score."""
    return [(x - MIN_SCORE) / (MAX_SCORE - MIN_SCORE) for x in gold]


def sts_correlations(gold: Sequence[float], similarities: dict[str, np.ndarray]) -> dict[str, float]:
    """``<similarity>_pearson`` and ``<similarity>_spearman`` of the normalised gold against each similarity."""
    from scipy.stats import ConstantInputWarning, pearsonr, spearmanr

    normalized = normalized_gold(gold)
    metrics: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)  # the NaN it warns of is the stored value
        for name, values in similarities.items():
            predicted = values.tolist()
            metrics[f"{name}_pearson"] = float(pearsonr(normalized, predicted)[0])
            metrics[f"{name}_spearman"] = float(spearmanr(normalized, predicted)[0])
    return metrics


def _tie_groups(values: np.ndarray) -> np.ndarray:
    """Each unit's group of equal values, groups numbered in increasing order of value."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    group = np.empty(len(values), np.int64)
    group[order] = np.cumsum(np.r_[True, ordered[1:] != ordered[:-1]]) - 1
    return group


def _drawn_ranks(groups: np.ndarray, n_groups: int) -> np.ndarray:
    """The average rank (scipy's ``rankdata``, method "average") of each draw of each resample, minus the mean rank
    (n + 1) / 2. ``groups`` (b, n): the tie group of each draw. A group drawn ``t`` times in all, with ``below``
    draws of smaller values, ranks ``below + (t + 1) / 2``: one count per group, no sort."""
    b, n = groups.shape
    cells = groups + n_groups * np.arange(b)[:, None]
    totals = np.bincount(cells.ravel(), minlength=b * n_groups).reshape(b, n_groups).astype(np.float64)
    centred = np.cumsum(totals, axis=1) - totals / 2 + (0.5 - (n + 1) / 2)
    return centred.ravel()[cells]


def _pearson_rows(dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Pearson's r of each row of centred values; NaN where a side is constant."""
    cov = np.einsum("ij,ij->i", dx, dy)
    var = np.einsum("ij,ij->i", dx, dx) * np.einsum("ij,ij->i", dy, dy)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(var > 0, cov / np.sqrt(var), np.nan)


def correlation_statistic(x: Sequence[float], y: Sequence[float], *, ranks: bool) -> Statistic:
    """Spearman's rho (``ranks``) or Pearson's r of (x, y) on each resample of the pairs. Ranks within a resample
    come from one sort of each side (:func:`_drawn_ranks`), so no resample is sorted: 1,000 resamples of 10,000
    pairs take under a second."""
    xs, ys = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if ranks:
        gx, gy = _tie_groups(xs), _tie_groups(ys)
        sizes = int(gx.max(initial=-1)) + 1, int(gy.max(initial=-1)) + 1

    def statistic(idx: np.ndarray) -> np.ndarray:
        out = np.empty(len(idx))
        for lo in range(0, len(idx), SUB_BLOCK):
            block = idx[lo:lo + SUB_BLOCK]
            if ranks:
                dx, dy = _drawn_ranks(gx[block], sizes[0]), _drawn_ranks(gy[block], sizes[1])
            else:
                dx, dy = xs[block], ys[block]
                dx, dy = dx - dx.mean(axis=1, keepdims=True), dy - dy.mean(axis=1, keepdims=True)
            out[lo:lo + len(block)] = _pearson_rows(dx, dy)
        return out

    return statistic


def sts_intervals(gold: Sequence[float], cosine: np.ndarray, *, resamples: int = DEFAULT_RESAMPLES,
                  seed: int = 0) -> dict[str, tuple[float | None, float | None]]:
    """Percentile-bootstrap intervals of cosine_spearman and cosine_pearson over the pairs."""
    if resamples <= 0 or not len(gold):
        return {}
    normalized = normalized_gold(gold)
    return {f"cosine_{name}": interval(correlation_statistic(normalized, cosine.tolist(), ranks=name == "spearman"),
                                       len(gold), resamples=resamples, seed=seed)
            for name in ("spearman", "pearson")}
