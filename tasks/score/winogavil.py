"""WinoGAViL's score as DataComp computes it (eval_utils/wino_eval.py), over cached embeddings.

Per game (a cue, its candidate images, the associations among them):

- each candidate scores the similarity of the cue's prompt (tasks/datasets/winogavil.clip_prompt) and the image:
  the dot product of their L2-normalised embeddings;
- k = the number of candidates that are associations (DataComp's ``y_true.sum()``);
- the k chosen candidates are ``np.argsort(scores)[-k:]``, DataComp's own call (numpy's default sort); with k = 0
  that slice takes every candidate, as in DataComp;
- the game scores the Jaccard index of the chosen and the true sets, |both| / |either| (scikit-learn's
  ``jaccard_score`` on the two boolean vectors, 0 when both are empty).

Ties: where the k-th and (k+1)-th best scores are equal, which candidate ``np.argsort`` keeps is numpy's choice (it
is not a stable sort for float arrays on CPUs with x86-simd-sort: equal scores need not stay in candidate order), so
it is reproduced by calling it the same way on the same dtype; such games are flagged ``tied`` and counted.

Metrics, named as DataComp writes them: ``avg_jaccard_score`` (every game), ``jaccard_score_5`` / ``_6`` / ``_10`` /
``_12`` (games with exactly that many candidates), ``jaccard_score_5-6`` (at most 6) and ``jaccard_score_10-12`` (at
least 10; DataComp's main metric). A group without games is NaN (numpy's mean of nothing, as in DataComp), written
as null.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clipcache.storage.arrow_columns import Ragged
from clipcache.tasks.score.evidence import Evidence
from clipcache.tasks.score.intervals import DEFAULT_RESAMPLES, interval

GAME_UNIT = "game"
MAIN_METRIC = "jaccard_score_10-12"
# flat metric name -> the games it averages, by their number of candidates (lowest, highest)
GROUPS: dict[str, tuple[int, float]] = {
    "avg_jaccard_score": (0, math.inf),
    "jaccard_score_5": (5, 5),
    "jaccard_score_6": (6, 6),
    "jaccard_score_10": (10, 10),
    "jaccard_score_12": (12, 12),
    "jaccard_score_5-6": (0, 6),
    "jaccard_score_10-12": (10, math.inf),
}


def chosen_candidates(scores: np.ndarray, k: int) -> np.ndarray:
    """The candidates DataComp picks: the last ``k`` of ``np.argsort(scores)`` (all of them for k = 0)."""
    return np.argsort(scores)[-k:]


def jaccard(truth: np.ndarray, predicted: np.ndarray) -> float:
    """|truth & predicted| / |truth | predicted| of two boolean vectors; 0 when both are empty (scikit-learn's
    ``jaccard_score`` with its default zero_division)."""
    union = int(np.sum(truth | predicted))
    return float(np.sum(truth & predicted)) / union if union else 0.0


def game_outcomes(cues: np.ndarray, candidates: list[np.ndarray], truth: list[np.ndarray]) -> dict[str, Any]:
    """Per game (its cue's normalised vector in row g of ``cues``, its candidates' normalised vectors in
    ``candidates[g]``, its associations in ``truth[g]``): ``value`` (the Jaccard index), ``target`` (the number of
    candidates: the game's group), ``prediction`` (how many chosen candidates are associations), ``top`` (the chosen
    candidates' positions, best first), ``tied`` (the k-th and (k+1)-th scores are equal: numpy's sort decided),
    ``margin`` (the k-th best score minus the (k+1)-th; NaN when k is 0 or every candidate is chosen) and ``score``
    (the k-th best score, the lowest chosen; NaN for k = 0)."""
    n = len(truth)
    out: dict[str, Any] = {"value": np.zeros(n), "target": np.zeros(n, np.int64),
                           "prediction": np.zeros(n, np.int64), "tied": np.zeros(n, bool),
                           "margin": np.full(n, np.nan), "score": np.full(n, np.nan)}
    top: list[list[int]] = []
    for g in range(n):
        scores = candidates[g] @ cues[g]  # the dtype of the cached vectors, as DataComp's logits keep theirs
        k, count = int(truth[g].sum()), len(scores)
        chosen = chosen_candidates(scores, k)
        predicted = np.isin(np.arange(count), chosen)
        out["value"][g] = jaccard(truth[g], predicted)
        out["target"][g] = count
        out["prediction"][g] = int(np.sum(truth[g] & predicted))
        top.append([int(i) for i in chosen[::-1]])
        if k:
            descending = np.sort(scores)[::-1]
            out["score"][g] = float(descending[k - 1])
            if k < count:
                out["margin"][g] = float(descending[k - 1]) - float(descending[k])
                out["tied"][g] = bool(descending[k - 1] == descending[k])
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum([len(t) for t in top], out=offsets[1:])
    out["top"] = Ragged(offsets, np.asarray([i for t in top for i in t], np.int32))
    return out


def in_group(candidates: np.ndarray, metric: str) -> np.ndarray:
    low, high = GROUPS[metric]
    return (candidates >= low) & (candidates <= high)


def winogavil_metrics(values: np.ndarray, candidates: np.ndarray) -> dict[str, float]:
    """Every DataComp metric from the games' Jaccard indices and numbers of candidates (NaN: a group without
    games)."""
    metrics = {}
    for metric in GROUPS:
        chosen = values[in_group(candidates, metric)]
        metrics[metric] = float(chosen.mean()) if len(chosen) else math.nan
    return metrics


class GroupJaccardStatistic:
    """A group's mean Jaccard index on index resamples of all the games (NaN for a resample without a game of the
    group): the games are what was drawn, the group a subset of each draw."""

    def __init__(self, values: np.ndarray, candidates: np.ndarray, metric: str):
        self.mask = in_group(np.asarray(candidates), metric).astype(np.float64)
        self.values = np.asarray(values, np.float64) * self.mask

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        counts = self.mask[idx].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(np.where(counts > 0, self.values[idx].sum(axis=1) / np.maximum(counts, 1), np.nan))


def jaccard_statistic(values: np.ndarray, candidates: np.ndarray, metric: str) -> GroupJaccardStatistic:
    return GroupJaccardStatistic(values, candidates, metric)


def game_evidence(outcomes: dict[str, Any], sample_index: np.ndarray, *, resamples: int = DEFAULT_RESAMPLES,
                  seed: int = 0, keys: list[str] | None = None) -> Evidence:
    """One row per game (unit ``game``): its Jaccard index in ``value``, its number of candidates in ``target``
    (every metric is the mean of ``value`` over its group's rows), ``prediction``, ``top``, ``tied``, ``margin`` and
    ``score`` as :func:`game_outcomes` gives them; each metric's interval resamples the games."""
    columns = {"sample_index": np.asarray(sample_index, np.int64), **outcomes}
    intervals = {}
    n = len(outcomes["value"])
    if resamples > 0 and n:
        for metric in GROUPS:
            if in_group(outcomes["target"], metric).any():
                intervals[metric] = interval(jaccard_statistic(outcomes["value"], outcomes["target"], metric), n,
                                             resamples=resamples, seed=seed)
    return Evidence(GAME_UNIT, columns, keys, intervals)
