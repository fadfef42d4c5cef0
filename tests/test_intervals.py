"""Bootstrap intervals and paired comparisons against scipy, the Wilson interval and hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from clipcache.tasks.score.intervals import (
    class_recall_statistic,
    compare_paired,
    holm,
    interval,
    mcnemar_exact,
    mean_statistic,
    verdict,
)


def balanced_accuracy(targets: np.ndarray, correct: np.ndarray) -> float:
    classes = np.unique(targets)
    return float(np.mean([correct[targets == c].mean() for c in classes]))


@pytest.mark.parametrize("n,p", [(2000, 0.7), (500, 0.95), (3000, 0.2)])
def test_mean_interval_matches_scipy_percentile_bootstrap(n, p):
    values = (np.random.default_rng(1).random(n) < p).astype(float)
    ours = interval(mean_statistic(values), n, resamples=4000, seed=3)
    ref = stats.bootstrap((values,), np.mean, n_resamples=4000, method="percentile", random_state=7,
                          vectorized=True).confidence_interval
    # Monte-Carlo error of a 2.5% quantile over 4,000 draws: about 0.4 standard errors of the mean
    se = values.std() / math.sqrt(n)
    assert abs(ours[0] - ref.low) < 0.6 * se and abs(ours[1] - ref.high) < 0.6 * se


def wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    phat = successes / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_proportion_interval_agrees_with_wilson():
    n = 10_000
    values = (np.random.default_rng(2).random(n) < 0.73).astype(float)
    low, high = interval(mean_statistic(values), n, resamples=4000, seed=0)
    w_low, w_high = wilson(int(values.sum()), n)
    assert abs(low - w_low) < 0.003 and abs(high - w_high) < 0.003


def test_class_recall_statistic_is_balanced_accuracy_and_matches_scipy():
    rng = np.random.default_rng(4)
    targets = rng.integers(0, 7, 1500)
    correct = (rng.random(1500) < 0.4 + 0.08 * targets).astype(float)
    statistic = class_recall_statistic(targets, correct, 7)
    assert statistic(np.arange(1500)[None, :])[0] == pytest.approx(balanced_accuracy(targets, correct), abs=1e-12)
    ours = interval(statistic, 1500, resamples=2000, seed=1)
    ref = stats.bootstrap((targets, correct), balanced_accuracy, paired=True, vectorized=False, n_resamples=2000,
                          method="percentile", random_state=2).confidence_interval
    assert abs(ours[0] - ref.low) < 0.008 and abs(ours[1] - ref.high) < 0.008


def test_a_class_missing_from_a_resample_is_left_out_not_zero():
    targets, correct = np.array([0, 0, 1]), np.array([1.0, 1.0, 0.0])
    statistic = class_recall_statistic(targets, correct, 3)  # class 2 never occurs
    assert statistic(np.array([[0, 1, 0]]))[0] == 1.0  # only class 0 drawn
    assert statistic(np.array([[0, 1, 2]]))[0] == 0.5


@pytest.mark.parametrize("to_correct,to_wrong,expected", [(0, 5, 2 * 0.5**5), (1, 5, 2 * (1 + 6) / 64),
                                                          (0, 0, 1.0), (3, 3, 1.0)])
def test_mcnemar_exact_hand_computed(to_correct, to_wrong, expected):
    assert mcnemar_exact(to_correct, to_wrong) == pytest.approx(expected, rel=1e-12)


def test_paired_difference_matches_scipy_and_counts_flips():
    rng = np.random.default_rng(5)
    a = (rng.random(4000) < 0.70).astype(float)
    b = np.where(rng.random(4000) < 0.9, a, 1 - a)  # mostly the same outcomes, some flipped
    result = compare_paired(mean_statistic(a), mean_statistic(b), 4000, resamples=4000, seed=1,
                            correct=(a, b), observed=(a.mean(), b.mean()))
    ref = stats.bootstrap((a, b), lambda x, y, axis: y.mean(axis) - x.mean(axis), paired=True, vectorized=True,
                          n_resamples=4000, method="percentile", random_state=3).confidence_interval
    assert abs(result.ci_low - ref.low) < 0.003 and abs(result.ci_high - ref.high) < 0.003
    assert result.flipped_to_correct == int(((a == 0) & (b == 1)).sum())
    assert result.flipped_to_wrong == int(((a == 1) & (b == 0)).sum())
    assert result.difference == pytest.approx(b.mean() - a.mean())
    assert result.p_value == pytest.approx(stats.binomtest(result.flipped_to_correct, result.flipped_to_correct
                                                           + result.flipped_to_wrong, 0.5).pvalue)


def test_identical_experiments_show_no_difference():
    a = (np.random.default_rng(6).random(300) < 0.5).astype(float)
    result = compare_paired(mean_statistic(a), mean_statistic(a), 300, correct=(a, a), observed=(a.mean(), a.mean()))
    assert (result.ci_low, result.ci_high, result.p_value) == (0.0, 0.0, 1.0)
    assert verdict(result) == "no detectable difference"


def test_a_clear_improvement_is_better_and_the_reverse_worse():
    rng = np.random.default_rng(7)
    a = (rng.random(2000) < 0.6).astype(float)
    b = np.maximum(a, (rng.random(2000) < 0.3).astype(float))  # only ever fixes mistakes
    better = compare_paired(mean_statistic(a), mean_statistic(b), 2000, correct=(a, b), observed=(a.mean(), b.mean()))
    worse = compare_paired(mean_statistic(b), mean_statistic(a), 2000, correct=(b, a), observed=(b.mean(), a.mean()))
    assert verdict(better) == "better" and verdict(worse) == "worse" and better.ci_low > 0


def test_holm_hand_computed():
    adjusted = holm([0.01, 0.04, 0.03, None])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06]) and adjusted[3] is None


def test_one_sample_and_no_samples():
    assert interval(mean_statistic(np.array([1.0])), 1) == (1.0, 1.0)
    assert interval(mean_statistic(np.array([])), 0) == (None, None)


def test_the_binary_shortcuts_draw_what_the_index_bootstrap_draws():
    """0/1 outcomes: binomial (one experiment) and multinomial (a pair) draws stand in for index matrices."""
    rng = np.random.default_rng(8)
    a = (rng.random(3000) < 0.6).astype(float)
    b = np.where(rng.random(3000) < 0.85, a, 1 - a)
    fast = interval(mean_statistic(a), 3000, resamples=4000, seed=1)
    slow = interval(lambda idx: a[idx].mean(axis=1), 3000, resamples=4000, seed=1)
    assert abs(fast[0] - slow[0]) < 0.004 and abs(fast[1] - slow[1]) < 0.004
    quick = compare_paired(mean_statistic(a), mean_statistic(b), 3000, resamples=4000, observed=(a.mean(), b.mean()))
    plain = compare_paired(lambda idx: a[idx].mean(axis=1), lambda idx: b[idx].mean(axis=1), 3000, resamples=4000,
                           observed=(a.mean(), b.mean()))
    assert abs(quick.ci_low - plain.ci_low) < 0.004 and abs(quick.ci_high - plain.ci_high) < 0.004
