"""Suite scores from the warehouse: honest averages with bootstrap intervals and a rank stability check.

For each model (model, checkpoint, precision) with a result on some dataset of the suite:

- the main metric of every dataset is read from the ``leaderboard`` view (its newest full, default-prompt result);
  a main metric made of several rows (``mean_recall@1``: both directions) is their mean;
- the suite score is the mean of the main metrics over **every** dataset of the suite. With one missing it is not
  computed: the missing datasets are listed and a partial mean over the present ones is given, labelled partial;
- the normalised score is the mean of (score - chance) / (1 - chance) (0: chance, 1: perfect), under the same rule;
- each with a 95% percentile-bootstrap interval: every dataset's samples are resampled on their own (the per-sample
  rows of the result's run), the main metric recomputed on each resample, and the suite mean taken per resample.
  A DataComp group metric (``F1-macro_all``, ``acc_wg``, ``acc_worst_region``, ``acc_top5_wg``: a minimum over
  groups or a mean over classes, tasks/suites/groups.py) is recomputed from the image rows and, for a worst group,
  the ``sample_metadata`` rows the run names (its row of unit ``metadata``), joined by sample key as the
  ``sample_groups`` view joins them.
  Resamples are seeded per dataset, so two models over the same samples see the same resamples: the difference of
  their suite scores is a paired bootstrap, and two models whose difference interval covers 0 are reported as not
  separable at the 5% level (rank stability).

A dataset without per-sample rows (a result older than them, or a metric they cannot recompute) has no resamples: the
interval is then left out and the reason given, never replaced by a narrower one.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.storage.experiment import LINK_UNIT
from clipcache.tasks.score import winogavil
from clipcache.tasks.score.intervals import (
    DEFAULT_RESAMPLES,
    class_recall_statistic,
    mean_statistic,
    paired_draws,
    percentile_interval,
)
from clipcache.tasks.suites import Suite, SuiteEntry, groups

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

Interval = tuple[float | None, float | None]
ModelKey = tuple[str, str | None, str | None, str | None]  # model, pretrained, checkpoint, precision


@dataclass
class DatasetResult:
    entry: SuiteEntry
    value: float | None = None
    experiment_id: str | None = None
    normalized: float | None = None  # (value - chance) / (1 - chance), None without a chance score
    draws: np.ndarray | None = None  # the main metric on each resample; None: no per-sample rows to resample
    why_no_draws: str | None = None


@dataclass
class ModelScore:
    model: ModelKey
    results: list[DatasetResult]
    score: float | None = None  # the suite score: only when every dataset has a result
    normalized: float | None = None  # the normalised score, under the same rule
    partial_score: float | None = None  # the mean over the present datasets, only when some are missing
    score_ci: Interval = (None, None)
    normalized_ci: Interval = (None, None)
    rank: int | None = None
    not_separable_from: list[str] = field(default_factory=list)
    groups: dict[str, float | None] = field(default_factory=dict)

    @property
    def label(self) -> str:
        model, pretrained, _, precision = self.model
        return model + (f" @ {pretrained}" if pretrained else "") + (
            f" [{precision}]" if precision not in (None, "fp32") else "")

    @property
    def missing(self) -> list[SuiteEntry]:
        return [r.entry for r in self.results if r.value is None]

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def present(self) -> list[DatasetResult]:
        return [r for r in self.results if r.value is not None]

    def suite_draws(self, normalized: bool = False) -> np.ndarray | None:
        """The suite mean on each resample; None unless every dataset has a result and resamples."""
        if not self.complete or any(r.draws is None for r in self.results):
            return None
        rows = []
        for r in self.results:
            assert r.draws is not None
            if normalized:
                if r.entry.chance is None:
                    return None
                rows.append((r.draws - r.entry.chance) / (1 - r.entry.chance))
            else:
                rows.append(r.draws)
        return np.mean(np.vstack(rows), axis=0)


def _seed(dataset: str, unit: str, seed: int) -> int:
    return (zlib.crc32(f"{dataset}\0{unit}".encode()) + seed) % (2**32)


def _suite_rows(con: DuckDBPyConnection, suite: Suite) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the suite_results rows, the suite_scores rows) of ``suite`` alone: the dbt marts' SQL (the one definition
    of a dataset's main metric and of the suite score, storage/sql_rules.py) over a table of this suite's datasets,
    so a suite file that is not shipped is scored by the same rule."""
    from clipcache.storage.sql_rules import render
    from clipcache.tasks.suites.sql import add_suite_datasets

    add_suite_datasets(con, [suite], "_scored_suite")
    over = {"stg_suite_datasets": "_scored_suite", "suite_results": "_scored_suite_results"}
    con.execute(f"CREATE OR REPLACE TEMP VIEW _scored_suite_results AS\n{render('suite_results', over)}")
    out = []
    for model in ("suite_results", "suite_scores"):
        cursor = con.execute(render(model, over))
        columns = [d[0] for d in cursor.description]
        out.append([dict(zip(columns, row, strict=True)) for row in cursor.fetchall()])
    return out[0], out[1]


def _samples(con: DuckDBPyConnection, experiment_id: str, unit: str | None) -> dict[str, np.ndarray]:
    where = "experiment_id = ?" + (" AND unit = ?" if unit else "")
    params = [experiment_id, unit] if unit else [experiment_id]
    columns = [c[0] for c in con.execute("DESCRIBE latest_samples").fetchall()]
    wanted = [c for c in ("unit", "sample_index", "target", "prediction", "correct1", "correct5", "hits_at",
                          "value") if c in columns]
    cursor = con.execute(f"SELECT {', '.join(wanted)} FROM latest_samples WHERE {where} ORDER BY sample_index",
                         params)
    rows = cursor.fetchall()
    return {name: np.array([r[i] for r in rows], dtype=object) for i, name in enumerate(wanted)}


def _draws(con: DuckDBPyConnection, result: DatasetResult, resamples: int, seed: int) -> None:
    """The main metric recomputed on every resample of the result's samples (into ``result.draws``)."""
    entry, experiment = result.entry, result.experiment_id
    assert experiment is not None
    parts = entry.metric_parts()
    metric, k = parts[0]
    if len(parts) == 2 and metric == "image_retrieval_recall" and k is not None:
        per_unit = []
        for unit in ("text_query", "image_query"):
            rows = _samples(con, experiment, unit)
            if "hits_at" not in rows or not len(rows["hits_at"]):
                result.why_no_draws = "no per-query rows with hits"
                return
            hits = np.array([k in (h if h is not None else ()) for h in rows["hits_at"]], dtype=np.float64)
            per_unit.append(paired_draws(mean_statistic(hits), len(hits), resamples=resamples,
                                         seed=_seed(entry.dataset, unit, seed)))
        result.draws = (per_unit[0] + per_unit[1]) / 2
        return
    if metric in winogavil.GROUPS:  # WinoGAViL's games: a group's mean Jaccard index (tasks/score/winogavil.py)
        games = _samples(con, experiment, winogavil.GAME_UNIT)
        if "value" not in games or not len(games["value"]):
            result.why_no_draws = "no per-game rows"
            return
        group_mean = winogavil.jaccard_statistic(games["value"].astype(np.float64),
                                                 games["target"].astype(np.int64), metric)
        result.draws = paired_draws(group_mean, len(games["value"]), resamples=resamples,
                                    seed=_seed(entry.dataset, winogavil.GAME_UNIT, seed))
        return
    rows = _samples(con, experiment, "image")
    if "target" not in rows or not len(rows["target"]):
        result.why_no_draws = "no per-sample rows"
        return
    if (found := groups.definition(entry.dataset, entry.main_metric)) is not None:
        _group_draws(con, result, found, resamples, seed)
        return
    n = len(rows["target"])
    rng_seed = _seed(entry.dataset, "image", seed)
    if (metric, k) in (("acc", 1), ("acc", 5)) and rows.get(f"correct{k}") is not None \
            and not any(v is None for v in rows[f"correct{k}"]):
        correct = rows[f"correct{k}"].astype(np.float64)
        result.draws = paired_draws(mean_statistic(correct), n, resamples=resamples, seed=rng_seed)
    elif metric == "mean_per_class_recall":
        target = rows["target"].astype(np.int64)
        right = rows["prediction"].astype(np.int64) == target
        statistic = class_recall_statistic(target, right, int(target.max()) + 1)
        result.draws = paired_draws(statistic, n, resamples=resamples, seed=rng_seed)
    else:
        result.why_no_draws = f"{entry.main_metric} is not recomputed from sample rows"


def _group_draws(con: DuckDBPyConnection, result: DatasetResult, found: tuple[str, str | None], resamples: int, seed: int) -> None:
    """A group metric recomputed on every resample of the result's image rows (those with the metric's field in
    the metadata the run was scored with), with the statistic the evaluation's interval uses."""
    kind, by = found
    entry, experiment = result.entry, result.experiment_id
    cursor = con.execute(
        "SELECT s.sample_index, s.target, s.prediction, s.correct1, s.correct5, m.code FROM latest_samples s "
        "LEFT JOIN latest_samples l ON l.experiment_id = s.experiment_id AND l.run_id = s.run_id AND l.unit = ? "
        "LEFT JOIN sample_metadata m ON m.dataset_id = l.sample_key AND m.sample_key = s.sample_key AND m.field = ? "
        "WHERE s.experiment_id = ? AND s.unit = 'image' ORDER BY s.sample_index", [LINK_UNIT, by, experiment])
    names = ("sample_index", "target", "prediction", "correct1", "correct5", "code")
    columns = dict(zip(names, (np.array(c, dtype=object) for c in zip(*cursor.fetchall(), strict=True)),
                       strict=True))
    if not columns:
        result.why_no_draws = "no per-sample rows"
        return
    codes = None
    if by is not None:
        grouped = np.array([c is not None for c in columns["code"]], dtype=bool)
        if not grouped.any():
            result.why_no_draws = f"no sample_metadata rows of field {by!r} for the run"
            return
        columns = {k: v[grouped] for k, v in columns.items()}  # as sample_groups: samples with the field
        codes = columns["code"].astype(np.int64)
    samples = {k: v.astype(np.int64) for k, v in columns.items() if k in ("target", "prediction")}
    samples.update({k: v.astype(np.float64) for k, v in columns.items()
                    if k in ("correct1", "correct5") and not any(x is None for x in v)})
    statistic = groups.statistic(kind, samples, codes)
    if statistic is None:
        result.why_no_draws = f"{entry.main_metric} is not defined on these samples"
        return
    result.draws = paired_draws(statistic, len(samples["target"]), resamples=resamples,
                                seed=_seed(entry.dataset, "image", seed))


def score_suite(con: DuckDBPyConnection, suite: Suite, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                models: list[str] | None = None, model_names: Collection[str] | None = None) -> list[ModelScore]:
    """One :class:`ModelScore` per model with a result on some dataset of the suite, ranked when complete. ``models``:
    only the models these words name, as ``compare`` takes a model (tasks/report/selectors.py; a name that fits none
    or several is refused); ``model_names``: only models of these names as results store them."""
    from clipcache.tasks.report.selectors import keep_models

    results_rows, score_rows = _suite_rows(con, suite)
    totals = {(r["model"], r["pretrained"], r["checkpoint"], r["precision"]): r for r in score_rows}
    by_model: dict[ModelKey, dict[int, dict[str, Any]]] = {}
    for row in keep_models(results_rows, models):
        if model_names is not None and row["model"] not in model_names:
            continue
        key = (row["model"], row["pretrained"], row["checkpoint"], row["precision"])
        by_model.setdefault(key, {})[row["position"]] = row
    scores = []
    for key, rows in sorted(by_model.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        results = []
        for position, entry in enumerate(suite.datasets):
            row = rows.get(position, {})
            result = DatasetResult(entry, row.get("value"), row.get("experiment_id"), row.get("normalized"))
            if result.value is not None and resamples > 0:
                _draws(con, result, resamples, seed)
            results.append(result)
        total = totals[key]
        score = ModelScore(key, results, total["score"], total["normalized"], total["partial_score"])
        for name, draws_of in (("score_ci", score.suite_draws(False)), ("normalized_ci", score.suite_draws(True))):
            if draws_of is not None:
                setattr(score, name, percentile_interval(draws_of))
        score.groups = {group: _group_mean(score, members) for group, members in suite.groups.items()}
        scores.append(score)
    rank_models(scores)
    return scores


def _group_mean(score: ModelScore, members: list[str]) -> float | None:
    values = [r.value for r in score.results if r.entry.dataset in members]
    return None if any(v is None for v in values) else float(np.mean([v for v in values if v is not None]))


def rank_models(scores: list[ModelScore], level: float = 0.95) -> None:
    """Ranks of the complete models by suite score, and for each the models it is not separable from: the paired
    bootstrap interval of the difference of their suite scores covers 0 (or no interval can be made)."""
    complete = sorted((s for s in scores if s.score is not None), key=lambda s: -(s.score or 0.0))
    for i, s in enumerate(complete, start=1):
        s.rank = i
    for a in complete:
        for b in complete:
            if a is b:
                continue
            da, db = a.suite_draws(), b.suite_draws()
            if da is None or db is None or len(da) != len(db):
                a.not_separable_from.append(b.label)
                continue
            low, high = percentile_interval(da - db, level)
            if low is None or high is None or low <= 0 <= high:
                a.not_separable_from.append(b.label)
