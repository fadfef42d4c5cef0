"""Confidence intervals and paired comparisons from per-sample outcomes.

Every interval here is a seeded percentile bootstrap over the units a metric averages (samples for classification,
queries for retrieval): draw ``resamples`` index vectors of length n with replacement, recompute the metric on each,
and take the 2.5th and 97.5th percentiles. The work is vectorised over blocks of resamples (an index matrix of
``block x n``), so 1,000 resamples of 50,000 samples take a fraction of a second and a few tens of MB.

A comparison of two experiments over the same samples resamples the samples once and recomputes both metrics on the
same draw (a paired bootstrap of the difference); for a proportion (acc@1, recall@k) the exact McNemar test on the
discordant pairs gives the p-value. Statistics are functions of an index matrix, so a metric that is not a plain mean
(mean per-class recall) is bootstrapped the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Statistic = Callable[[np.ndarray], np.ndarray]  # (resamples, n) index matrix -> (resamples,) values
DEFAULT_RESAMPLES = 1000
BLOCK_CELLS = 4_000_000  # indices per block: 16 MB of int32


def _blocks(n: int, resamples: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    per_block = max(1, BLOCK_CELLS // max(n, 1))
    sizes = [min(per_block, resamples - lo) for lo in range(0, resamples, per_block)]
    dtype = np.int32 if n < 2**31 else np.int64
    return [rng.integers(0, n, size=(size, n), dtype=dtype) for size in sizes]


def bootstrap(statistic: Statistic, n: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """The statistic on ``resamples`` seeded resamples of n units (with replacement)."""
    if n == 0 or resamples <= 0:
        return np.empty(0)
    if isinstance(statistic, MeanStatistic) and statistic.binary:
        p = float(statistic.values.mean())
        return np.random.default_rng(seed).binomial(n, p, size=resamples) / n
    if isinstance(statistic, ClassRecallStatistic) and (drawn := statistic.draws(n, resamples, seed)) is not None:
        return drawn
    return np.concatenate([statistic(idx) for idx in _blocks(n, resamples, seed)])


def paired_draws(statistic: Statistic, n: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """The statistic on ``resamples`` seeded index resamples of n units, always drawn as index vectors: two
    statistics over the same units with the same seed see the same resamples (a paired bootstrap across calls, which
    the binomial shortcut of :func:`bootstrap` would not give)."""
    if n == 0 or resamples <= 0:
        return np.empty(0)
    return np.concatenate([statistic(idx) for idx in _blocks(n, resamples, seed)])


def percentile_interval(draws: np.ndarray, level: float = 0.95) -> tuple[float | None, float | None]:
    """The central ``level`` interval of the bootstrap draws (NaN draws, e.g. an empty class, are left out)."""
    draws = draws[~np.isnan(draws)]
    if len(draws) == 0:
        return None, None
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


class MeanStatistic:
    """The mean of per-unit values. For 0/1 outcomes the mean of a resample is a binomial draw over n divided by n,
    exactly the distribution the index bootstrap samples, so :func:`bootstrap` draws it directly (no index matrix)."""

    def __init__(self, values: np.ndarray):
        self.values = np.asarray(values, dtype=np.float64)
        self.binary = bool(np.isin(self.values, (0.0, 1.0)).all())

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        return np.asarray(self.values[idx].mean(axis=1))


def mean_statistic(values: np.ndarray) -> MeanStatistic:
    return MeanStatistic(values)


class ClassRecallStatistic:
    """Mean per-class recall (balanced accuracy) of each resample: the mean over the classes present in the resample
    of (correct in that class) / (samples of that class), as clip_benchmark computes it.

    The statistic depends on a resample only through its counts of (class, right or wrong) cells, and the counts of
    an index resample are a multinomial draw over the cells with their observed proportions: :func:`bootstrap` draws
    those counts directly (2 x classes numbers per resample instead of n indices), the same distribution at a
    fraction of the cost. Called on an index matrix it computes the same statistic from the indices (for paired
    comparisons, which must see the same resamples on both sides)."""

    def __init__(self, targets: np.ndarray, correct: np.ndarray, n_classes: int):
        self.targets = np.asarray(targets, dtype=np.int64)
        self.correct = np.asarray(correct, dtype=np.float64)
        self.n_classes = n_classes

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        b, c = len(idx), self.n_classes
        cells = (self.targets[idx] + c * np.arange(b)[:, None]).ravel()
        totals = np.bincount(cells, minlength=b * c).reshape(b, c)
        hits = np.bincount(cells, weights=self.correct[idx].ravel(), minlength=b * c).reshape(b, c)
        return _balanced(hits, totals)

    def draws(self, n: int, resamples: int, seed: int) -> np.ndarray | None:
        """Resampled statistics from multinomial cell counts; None when the outcomes are not 0/1."""
        if not np.isin(self.correct, (0.0, 1.0)).all():
            return None
        c = self.n_classes
        cells = self.targets + c * (self.correct > 0)  # wrong: class, right: classes + class
        proportions = np.bincount(cells, minlength=2 * c) / n
        counts = np.random.default_rng(seed).multinomial(n, proportions, size=resamples)
        wrong, right = counts[:, :c], counts[:, c:]
        return _balanced(right.astype(np.float64), wrong + right)


def _balanced(hits: np.ndarray, totals: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(totals > 0, hits / np.maximum(totals, 1), np.nan)
    return np.asarray(np.nanmean(recall, axis=1))


def class_recall_statistic(targets: np.ndarray, correct: np.ndarray, n_classes: int) -> ClassRecallStatistic:
    return ClassRecallStatistic(targets, correct, n_classes)


class GroupMeanStatistic:
    """Per-group means of per-unit values (DataComp's group metrics: a group's accuracy, a face head's outcome rate
    in a group) on index resamples of all the units, and their minimum over the groups present in the resample
    (``acc_wg``, ``acc_worst_region``, ``acc_top5_wg``, ``<metric>_wg``).

    The units are resampled as every other interval here resamples them: n indices drawn with replacement from
    all n units, not within each group. The groups' sizes then vary from resample to resample as they would in
    another test set drawn from the same population, and a group may be missing from a resample: it is left out
    of that resample's minimum, as WILDS leaves out groups without samples (its ``worst`` over ``group_counts >
    0``), and its own mean is NaN there (:func:`percentile_interval` drops NaN draws). Resampling within groups
    would hold the sizes fixed and leave out that part of the variance; and one index matrix for all statistics
    of a dataset keeps them paired with each other and with another model's over the same samples (the suites'
    paired bootstrap), which stratifying by one grouping would not.

    Called on an index matrix: the minimum (the worst group). :meth:`table`: every group's mean."""

    def __init__(self, values: np.ndarray, codes: np.ndarray):
        self.values = np.asarray(values, dtype=np.float64)
        self.groups, inverse = np.unique(np.asarray(codes), axis=0, return_inverse=True)
        self.codes = inverse.reshape(-1).astype(np.int64)  # dense 0..G-1, in the order of ``groups``

    def table(self, idx: np.ndarray) -> np.ndarray:
        """(resamples, groups): each group's mean on each resample, NaN where the resample has none of it."""
        b, g = len(idx), len(self.groups)
        cells = (self.codes[idx] + g * np.arange(b)[:, None]).ravel()
        totals = np.bincount(cells, minlength=b * g).reshape(b, g)
        sums = np.bincount(cells, weights=self.values[idx].ravel(), minlength=b * g).reshape(b, g)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(totals > 0, sums / np.maximum(totals, 1), np.nan)

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        return worst_of(self.table(idx))


def worst_of(table: np.ndarray) -> np.ndarray:
    """Each row's minimum over its non-NaN cells (NaN for a row without any)."""
    present = ~np.isnan(table)
    lowest = np.where(present, table, np.inf).min(axis=1)
    return np.where(present.any(axis=1), lowest, np.nan)


def worst_group_statistic(values: np.ndarray, codes: np.ndarray) -> GroupMeanStatistic:
    """The lowest per-group mean of ``values`` over the groups present in each resample. ``codes``: one group code
    per unit, or one row of codes per unit (a group is a combination of several fields' codes)."""
    return GroupMeanStatistic(values, codes)


class MacroF1Statistic:
    """WILDS' ``F1-macro_all`` (sklearn's macro F1 over the classes present in the targets) of each resample: the
    mean over the classes with a target in the resample of 2 tp / (predicted + support), a prediction of a class
    absent from the resample's targets counting only as a miss of its own target."""

    def __init__(self, targets: np.ndarray, predictions: np.ndarray):
        labels, inverse = np.unique(np.concatenate([np.asarray(targets, np.int64), np.asarray(predictions, np.int64)]),
                                    return_inverse=True)
        n = len(targets)
        self.n_labels = len(labels)
        self.targets, self.predictions = inverse[:n].astype(np.int64), inverse[n:].astype(np.int64)
        self.right = (self.targets == self.predictions).astype(np.float64)

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        b, c = len(idx), self.n_labels
        offset = c * np.arange(b)[:, None]
        size = b * c
        target_cells = (self.targets[idx] + offset).ravel()
        support = np.bincount(target_cells, minlength=size).reshape(b, c)
        predicted = np.bincount((self.predictions[idx] + offset).ravel(), minlength=size).reshape(b, c)
        tp = np.bincount(target_cells, weights=self.right[idx].ravel(), minlength=size).reshape(b, c)
        present = support > 0
        f1 = np.where(present, 2.0 * tp / np.maximum(predicted + support, 1), 0.0)
        return np.asarray(f1.sum(axis=1) / present.sum(axis=1))


def macro_f1_statistic(targets: np.ndarray, predictions: np.ndarray) -> MacroF1Statistic:
    return MacroF1Statistic(targets, predictions)


def column_draws(columns: Callable[[np.ndarray], np.ndarray], n: int, *, resamples: int = DEFAULT_RESAMPLES,
                 seed: int = 0) -> np.ndarray:
    """(resamples, m): ``columns`` (an index matrix -> (resamples, m) values) on the seeded index resamples of
    :func:`paired_draws`; column j is what a statistic computing column j alone would draw with the same seed, so
    several statistics of one index draw (a face metric's mean, its groups and its worst group) cost one draw."""
    if n == 0 or resamples <= 0:
        return np.empty((0, 0))
    return np.concatenate([columns(idx) for idx in _blocks(n, resamples, seed)])


def interval(statistic: Statistic, n: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
             level: float = 0.95) -> tuple[float | None, float | None]:
    """A seeded percentile-bootstrap interval; (None, None) when there is nothing to resample."""
    return percentile_interval(bootstrap(statistic, n, resamples=resamples, seed=seed), level)


@dataclass(frozen=True)
class PairedComparison:
    """Candidate minus baseline over the same units."""

    n: int
    baseline: float
    candidate: float
    difference: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None  # exact McNemar for proportions, else the bootstrap's two-sided p
    flipped_to_correct: int | None  # baseline wrong, candidate right
    flipped_to_wrong: int | None  # baseline right, candidate wrong


def mcnemar_exact(to_correct: int, to_wrong: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of the discordant pairs against 1/2."""
    from scipy.stats import binomtest

    discordant = to_correct + to_wrong
    return 1.0 if discordant == 0 else float(binomtest(to_correct, discordant, 0.5).pvalue)


def compare_paired(baseline: Statistic, candidate: Statistic, n: int, *, resamples: int = DEFAULT_RESAMPLES,
                   seed: int = 0, level: float = 0.95, correct: tuple[np.ndarray, np.ndarray] | None = None,
                   observed: tuple[float, float]) -> PairedComparison:
    """The paired bootstrap of candidate - baseline (each resample drawn once, both metrics on it). ``correct``:
    the two experiments' per-unit 0/1 outcomes when the metric is a proportion (McNemar and the flips)."""
    if isinstance(baseline, MeanStatistic) and isinstance(candidate, MeanStatistic) and baseline.binary \
            and candidate.binary:
        # four kinds of unit (both right, only baseline, only candidate, both wrong): a resample is a multinomial
        # draw of their counts, and the difference is (only candidate - only baseline) / n
        a, b = baseline.values.astype(bool), candidate.values.astype(bool)
        cells = np.array([(a & b).sum(), (a & ~b).sum(), (~a & b).sum(), (~a & ~b).sum()], dtype=np.float64) / n
        counts = np.random.default_rng(seed).multinomial(n, cells, size=resamples)
        draws = (counts[:, 2] - counts[:, 1]) / n
    else:
        draws = bootstrap(lambda idx: candidate(idx) - baseline(idx), n, resamples=resamples, seed=seed)
    low, high = percentile_interval(draws, level)
    difference = observed[1] - observed[0]
    to_correct: int | None = None
    to_wrong: int | None = None
    p: float | None
    if correct is not None:
        a, b = (np.asarray(c, dtype=bool) for c in correct)
        to_correct, to_wrong = int((~a & b).sum()), int((a & ~b).sum())
        p = mcnemar_exact(to_correct, to_wrong)
    else:
        valid = draws[~np.isnan(draws)]
        p = float(min(1.0, 2 * min((valid <= 0).mean(), (valid >= 0).mean()))) if len(valid) else None
    return PairedComparison(n, observed[0], observed[1], difference, low, high, p, to_correct, to_wrong)


def holm(p_values: list[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (family-wise error over the comparisons made together)."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    m = len(present)
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(comparison: PairedComparison, higher_is_better: bool = True, alpha: float = 0.05) -> str:
    """better / worse / no detectable difference, at level alpha (on the unadjusted p-value)."""
    if comparison.p_value is None or comparison.p_value >= alpha or comparison.difference == 0:
        return "no detectable difference"
    improved = comparison.difference > 0 if higher_is_better else comparison.difference < 0
    return "better" if improved else "worse"
