"""Compare two experiments (or two models' experiments) sample by sample: is the difference real?

Both sides are read from the warehouse's ``samples`` rows of their latest completed run. Experiments are paired by
dataset, split, language, task and precision; each pair must cover the same samples (same count, same sample keys
where the dataset has them) or the comparison is refused. Per metric: the difference, its paired-bootstrap 95%
interval, a p-value (exact McNemar for acc@1 / acc@5, the bootstrap's for mean per-class recall), the samples flipped
each way, a verdict at the 5% level, and Holm-adjusted p-values across everything compared at once.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.storage.errors import ConfigError, ResultsError
from clipcache.storage.experiment import REFERENCE_OPTIONS
from clipcache.tasks.report.selectors import select
from clipcache.tasks.score.intervals import (
    DEFAULT_RESAMPLES,
    Statistic,
    class_recall_statistic,
    compare_paired,
    holm,
    mean_statistic,
    verdict,
)

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

PAIR_GRAIN = ("dataset", "split", "language", "task", "precision")


@dataclass
class ComparisonRow:
    dataset: str
    task: str
    metric: str
    n: int
    baseline: float
    candidate: float
    difference: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_holm: float | None
    flipped_to_correct: int | None
    flipped_to_wrong: int | None
    verdict: str
    baseline_experiment: str
    candidate_experiment: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def metric_order(name: str) -> tuple[tuple[int, Any], ...]:
    """Metric names in reading order: the numbers in a name by value (recall@1, recall@5, recall@10)."""
    return tuple((1, int(part)) if part.isdigit() else (0, part) for part in re.split(r"(\d+)", name))


def _experiments(con: DuckDBPyConnection, selector: str) -> list[dict[str, Any]]:
    """The experiments a selector names (tasks/report/selectors.py: an experiment id or a unique prefix of one, or
    a model as results or ``eval`` name it); for a model, its reference experiments (full data, own prompts,
    default options)."""
    columns = ["experiment_id", "model", "pretrained", "checkpoint", *PAIR_GRAIN, "sample_limit", "default_prompts",
               "task_options"]
    rows = con.execute(f"SELECT DISTINCT {', '.join(columns)} FROM metrics").fetchall()
    found = [dict(zip(columns, r, strict=True)) for r in rows]
    named = select(found, selector)
    if len(named) == 1 and named[0]["experiment_id"].startswith(selector):
        return named  # an experiment named by its id is compared as given
    plain = [e for e in named if e["default_prompts"] and e["task_options"] in REFERENCE_OPTIONS]
    return [e for e in plain if e["sample_limit"] is None] or plain


# What is compared, per task: the units of sample rows with one right-or-wrong outcome per sample, and how their
# metrics are named; and WinoGAViL's games, each with its Jaccard index (a mean per group of games, no flips).
# Clustering and multilabel classification (no per-sample outcome) and text / any-to-any retrieval (their recall is
# a fraction of relevant documents, not a hit) are not compared.
SELECTION_UNITS = {"item": "acc", "item_text": "text_acc", "item_image": "image_acc"}
RETRIEVAL_UNITS = {"text_query": "image_retrieval_recall", "image_query": "text_retrieval_recall"}


def _caption_units() -> dict[str, str]:
    """captioning: each metric that is the mean of its per-image rows (CIDEr, ROUGE-L, SPICE, CLIPScore, ...),
    compared image by image; corpus BLEU and METEOR are not means of their rows and are not compared."""
    from clipcache.tasks.score.caption_metrics import MEAN_OF_IMAGES
    from clipcache.tasks.score.caption_scoring import unit_name

    return {unit_name(metric): metric for metric in MEAN_OF_IMAGES}


def _units(task: str) -> list[str]:
    if task in ("zeroshot_classification", "linear_probe"):
        return ["image"]
    if task == "image_caption_selection":
        return list(SELECTION_UNITS)
    if task == "zeroshot_retrieval":
        return list(RETRIEVAL_UNITS)
    if task == "multiple_choice":
        return ["example"]
    if task == "winogavil":
        return ["game"]
    if task == "captioning":
        return list(_caption_units())
    return []


def _samples(con: DuckDBPyConnection, experiment_id: str, unit: str) -> dict[str, np.ndarray]:
    """The experiment's rows of one unit from its latest completed run, in sample order."""
    table = con.sql(
        "SELECT sample_index, sample_key, target, prediction, correct1, correct5, hits_at, value FROM latest_samples "
        "WHERE experiment_id = ? AND unit = ? ORDER BY sample_index", params=[experiment_id, unit]).to_arrow_table()
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def _binary(values: np.ndarray) -> tuple[Statistic, float, np.ndarray]:
    right = values.astype(bool)
    return mean_statistic(right.astype(float)), float(right.mean()), right


def _statistics(task: str, unit: str, s: dict[str, np.ndarray],
                n_classes: int) -> dict[str, tuple[Statistic, float, np.ndarray | None]]:
    out: dict[str, tuple[Statistic, float, np.ndarray | None]] = {}
    if unit in RETRIEVAL_UNITS:  # a hit at k per query, as the stored recall@k counts it (its tie rule)
        hits = [set(h) if h is not None else set() for h in s["hits_at"]]
        asked = sorted(set().union(*hits)) if hits else []
        for k in asked:
            out[f"{RETRIEVAL_UNITS[unit]}@{k}"] = _binary(np.array([k in h for h in hits]))
        return out
    if unit in SELECTION_UNITS:
        out[SELECTION_UNITS[unit]] = _binary(s["correct1"])
        return out
    if task == "captioning":  # a per-image score whose mean is the metric
        values = s["value"].astype(np.float64)
        out[_caption_units()[unit]] = (mean_statistic(values), float(values.mean()), None)
        return out
    if unit == "game":  # each WinoGAViL group's mean Jaccard index, resampling all the games (target: candidates)
        from clipcache.tasks.score.winogavil import GROUPS, in_group, jaccard_statistic

        values, candidates = s["value"].astype(np.float64), s["target"].astype(np.int64)
        for metric in GROUPS:
            chosen = in_group(candidates, metric)
            if chosen.any():
                out[metric] = (jaccard_statistic(values, candidates, metric), float(values[chosen].mean()), None)
        return out
    prefix = "lp_" if task == "linear_probe" else ""
    out[f"{prefix}acc1"] = _binary(s["correct1"])
    if not np.any(s["correct5"] == None):  # noqa: E711 - elementwise: null below 5 classes
        out[f"{prefix}acc5"] = _binary(s["correct5"])
    if unit == "image":
        right = s["prediction"] == s["target"]
        statistic = class_recall_statistic(s["target"].astype(np.int64), right, n_classes)
        out[f"{prefix}mean_per_class_recall"] = (statistic, float(statistic(np.arange(len(right))[None, :])[0]),
                                                 None)
    return out


def paired_experiments(con: DuckDBPyConnection, baseline: str, candidate: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The (baseline, candidate) experiment pairs two selections share: same dataset, split, language, task and
    precision (and, for models' experiments, the same sample limit). ConfigError in one line when a side matches
    nothing or the two share nothing; ResultsError when two named experiments cover different sample limits."""
    a_side, b_side = _experiments(con, baseline), _experiments(con, candidate)
    for selector, side in ((baseline, a_side), (candidate, b_side)):
        if not side:
            raise ConfigError(f"compare: no completed experiment matches {selector!r} (an experiment id, a model "
                              f"name, model@checkpoint or a checkpoint; see `clipcache query \"SELECT DISTINCT "
                              f"experiment_id, model, pretrained, dataset FROM metrics\"`)")
    # two named experiments are compared as given; models' experiments pair up over the same sample limit
    single = len(a_side) == 1 and len(b_side) == 1
    pairs = [(a, b) for a in a_side for b in b_side if all(a[k] == b[k] for k in PAIR_GRAIN)
             and (single or a["sample_limit"] == b["sample_limit"])]
    if not pairs:
        raise ConfigError(f"compare: {baseline!r} and {candidate!r} share no dataset, split, language, task and "
                          f"precision")
    for a, b in pairs:
        if a["sample_limit"] != b["sample_limit"]:
            raise ResultsError(f"compare: {a['dataset']}: the experiments cover different samples (sample limit "
                               f"{a['sample_limit']} vs {b['sample_limit']}); compare runs over the same samples")
    return sorted(pairs, key=lambda p: tuple(str(p[0][k]) for k in PAIR_GRAIN))


def _compare_unit(con: DuckDBPyConnection, a: dict[str, Any], b: dict[str, Any], unit: str, *, resamples: int,
                  seed: int) -> list[ComparisonRow]:
    sa, sb = _samples(con, a["experiment_id"], unit), _samples(con, b["experiment_id"], unit)
    if not len(sa["sample_index"]) or not len(sb["sample_index"]):
        return []  # no sample rows (a run of an older release)
    # an image query's target is each model's own best caption, a caption row has none: the samples are the same
    # when the keys are
    same = len(sa["sample_index"]) == len(sb["sample_index"]) \
        and np.array_equal(sa["sample_index"], sb["sample_index"]) \
        and (unit == "image_query" or a["task"] == "captioning" or np.array_equal(sa["target"], sb["target"])) \
        and (sa["sample_key"] == sb["sample_key"]).all()
    if not same:
        raise ResultsError(f"compare: {a['dataset']}: the experiments cover different samples ({len(sa['target'])} "
                           f"vs {len(sb['target'])} rows of {unit}, or other targets); compare runs over the same data")
    n_classes = 0
    if unit == "image":
        n_classes = int(max(sa["target"].max(), sa["prediction"].max(), sb["prediction"].max())) + 1
    stats_a, stats_b = _statistics(a["task"], unit, sa, n_classes), _statistics(b["task"], unit, sb, n_classes)
    rows = []
    for metric in sorted(stats_a.keys() & stats_b.keys(), key=metric_order):
        (fa, va, ca), (fb, vb, cb) = stats_a[metric], stats_b[metric]
        result = compare_paired(fa, fb, len(sa["sample_index"]), resamples=resamples, seed=seed, observed=(va, vb),
                                correct=(ca, cb) if ca is not None and cb is not None else None)
        rows.append(ComparisonRow(a["dataset"], a["task"], metric, result.n, va, vb, result.difference,
                                  result.ci_low, result.ci_high, result.p_value, None, result.flipped_to_correct,
                                  result.flipped_to_wrong, verdict(result), a["experiment_id"], b["experiment_id"]))
    return rows


def compare(con: DuckDBPyConnection, baseline: str, candidate: str, *, resamples: int = DEFAULT_RESAMPLES,
            seed: int = 0) -> list[ComparisonRow]:
    """Every metric the two selections share with sample rows, compared pair by pair."""
    pairs = paired_experiments(con, baseline, candidate)
    rows: list[ComparisonRow] = []
    for a, b in pairs:
        for unit in _units(a["task"]):
            rows += _compare_unit(con, a, b, unit, resamples=resamples, seed=seed)
    if not rows:
        raise ResultsError("compare: none of the paired experiments has sample rows to compare (they are written by "
                           "clipcache 0.2 and newer, and `clipcache rescore` adds them from the cache; clustering, "
                           "multilabel classification and text retrieval are not compared sample by sample)")
    for row, adjusted in zip(rows, holm([r.p_value for r in rows]), strict=True):
        row.p_holm = adjusted
    rows.sort(key=lambda r: (r.dataset, metric_order(r.metric)))
    return rows
