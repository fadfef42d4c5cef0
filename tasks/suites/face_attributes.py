"""FairFace / UTKFace group metrics (DataComp's ``FairFaceEvaluator``) in SQL over the per-sample rows of the four
heads joined with the ``sample_metadata`` table (the dbt models' SQL, which the evaluation runs too), and their
bootstrap intervals in NumPy.

Each metric is the mean of a per-sample 0/1 outcome of one head's prediction (group_layouts.json ``head_metrics``):

- ``equals``: prediction == the sample's ``truth`` field (``acc_gender``, ``acc_age``, ``acc_gender_x``);
- ``not_class``: (prediction != ``class``) == the ``truth`` field (``acc_race``: "not class 1" against
  ``race_binary``);
- ``range``: ``low`` <= prediction < ``high`` (``toxicity_crime``: a crime label, >= 18; ``toxicity_nonhuman``:
  14..17), DataComp's Accuracy against all-ones, i.e. the share of faces given such a label.

Names are those WILDS' ``standard_group_eval`` writes for DataComp: ``<metric>_avg`` over all samples;
``<metric>_<group>`` per group of the ``by`` fields, the group written as WILDS' ``group_field_str`` writes it
(``field:code``, several fields joined by ``_`` last field first: ``acc_gender_x_race:3_gender:1``); and
``<metric>_wg``, the lowest per-group value over the groups with samples (WILDS' ``worst`` is the minimum, for the
toxicity rates too). A group without samples has no row (DataComp writes NaN for it, and ``count_<group>`` rows,
which are the ``n`` of the view here).

The evaluation's per-sample rows are of unit ``face_<objective>`` (``face_race``, ``face_gender``, ``face_age``,
``face_toxic``): the sample and its head's argmax in ``prediction``. The evaluation computes the metric rows with
the views below over those rows (:func:`face_metrics`), and each carries a 95% bootstrap interval over index
resamples of the faces (:func:`face_intervals`), drawn in NumPy from the outcomes and group names those views give
(:func:`face_outcomes`): the rules themselves exist once, in SQL. Views (added by :func:`register`), each the
SQL of the dbt model of its name (``face_outcomes``: stg_face_outcomes) rendered by storage/sql_rules.py:

- ``face_definitions``: (dataset, metric, head, rule, class_code, low, high, truth, by1, by2);
- ``face_outcomes``: per (experiment, metric, sample): the head's prediction, the outcome and the group codes;
- ``face_group_metrics``: per (experiment, metric, group): ``name`` (DataComp's), ``n``, ``value``;
- ``face_metrics``: per experiment, every metric by DataComp's name (``metric``, ``value``, ``groups``); the
  ``group_metrics`` view includes these rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.tasks.score.intervals import DEFAULT_RESAMPLES

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

    from clipcache.storage.sample_metadata import SampleMetadata
    from clipcache.tasks.score.intervals import GroupMeanStatistic

UNIT_PREFIX = "face_"  # a sample row of unit face_<objective>: that head's prediction


def head_metrics(dataset: str) -> list[dict[str, Any]]:
    from clipcache.tasks.datasets.datacomp.group_layouts import group_layouts

    return list(group_layouts()[dataset].get("head_metrics", []))


def definitions() -> list[tuple[Any, ...]]:
    """(dataset, metric, head, rule, class_code, low, high, truth, by1, by2) of every face-attribute metric."""
    from clipcache.tasks.datasets.datacomp.group_layouts import group_layouts

    return [(name, m["metric"], m["head"], m["rule"], m.get("class"), m.get("low"), m.get("high"), m.get("truth"),
             m["by"][0], m["by"][1] if len(m["by"]) > 1 else None)
            for name, entry in sorted(group_layouts().items()) for m in entry.get("head_metrics", [])]


def _rows(dataset: str, positions: np.ndarray, predictions: dict[str, np.ndarray]) -> dict[str, Any]:
    """The sample rows the evaluation writes: per head, unit ``face_<head>``, the faces and the head's argmax."""
    heads = sorted({spec["head"] for spec in head_metrics(dataset)})
    return {"unit": [f"{UNIT_PREFIX}{h}" for h in heads for _ in positions],
            "sample_index": np.concatenate([positions for _ in heads]) if heads else positions[:0],
            "prediction": np.concatenate([np.asarray(predictions[h], np.int64) for h in heads]) if heads
            else positions[:0]}


def face_metrics(dataset: str, positions: np.ndarray, predictions: dict[str, np.ndarray],
                 metadata: SampleMetadata) -> dict[str, float]:
    """DataComp's FairFace / UTKFace metrics from each head's predictions for the samples at ``positions``, by the
    warehouse's own SQL over the rows the evaluation writes (tasks/suites/groups.py ``rule_metrics``)."""
    from clipcache.tasks.suites.groups import rule_metrics

    positions = np.asarray(positions, np.int64)
    return rule_metrics(dataset, _rows(dataset, positions, predictions), metadata)


def face_outcomes(dataset: str, positions: np.ndarray, predictions: dict[str, np.ndarray],
                  metadata: SampleMetadata) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """metric -> (each face's 0/1 outcome, in ``positions`` order; its group key, one code per ``by`` field; each
    key's metric name, DataComp's), read from the ``face_outcomes`` and ``face_group_metrics`` views (the dbt models'
    SQL) over the rows the evaluation writes: the rule of an outcome and of a group's name is the SQL's."""
    from clipcache.tasks.suites.groups import rule_connection

    with rule_connection(_rows(dataset, positions, predictions), metadata) as con:
        found = con.execute(
            "SELECT o.metric, o.sample_index, o.outcome, o.code1, coalesce(o.code2, 0), g.name "
            "FROM face_outcomes o JOIN face_group_metrics g ON g.metric = o.metric AND g.by1 = o.by1 "
            "AND g.code1 = o.code1 AND g.by2 IS NOT DISTINCT FROM o.by2 AND g.code2 IS NOT DISTINCT FROM o.code2 "
            "WHERE o.dataset = ? ORDER BY o.metric, o.sample_index", [dataset]).fetchall()
    order = {int(p): i for i, p in enumerate(positions)}
    out: dict[str, tuple[np.ndarray, np.ndarray, list[str]]] = {}
    for spec in head_metrics(dataset):
        mine = [r for r in found if r[0] == spec["metric"]]
        at = np.array([order[r[1]] for r in mine], np.int64)
        values, keys = np.zeros(len(positions)), np.zeros((len(positions), len(spec["by"])), np.int64)
        values[at] = [r[2] for r in mine]
        keys[at] = [r[3:3 + len(spec["by"])] for r in mine]
        names = {tuple(int(c) for c in r[3:3 + len(spec["by"])]): r[5] for r in mine}
        out[spec["metric"]] = (values, keys, [names[k] for k in sorted(names)])
    return out


def face_draws(dataset: str, positions: np.ndarray, predictions: dict[str, np.ndarray], metadata: SampleMetadata,
               *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict[str, np.ndarray]:
    """metric -> its value on each of ``resamples`` seeded index resamples of the faces (every name
    :func:`face_metrics` gives): ``_avg`` the mean outcome of the resample, ``<metric>_<group>`` the group's mean
    (NaN in a resample without the group), ``_wg`` the lowest of those present (tasks/score/intervals.py
    ``GroupMeanStatistic``: why the faces are resampled together, not within groups). Every metric sees the same
    resamples (one seed), so a metric's draws are those a statistic of it alone would take."""
    from clipcache.tasks.score.intervals import column_draws, worst_group_statistic, worst_of

    positions = np.asarray(positions, np.int64)
    out: dict[str, np.ndarray] = {}
    n = len(positions)
    if not n or resamples <= 0:
        return out
    outcomes = face_outcomes(dataset, positions, predictions, metadata)
    for spec in head_metrics(dataset):
        values, keys, names = outcomes[spec["metric"]]
        groups = worst_group_statistic(values, keys)

        def columns(idx: np.ndarray, values: np.ndarray = values, groups: GroupMeanStatistic = groups) -> np.ndarray:
            table = groups.table(idx)
            return np.column_stack([values[idx].mean(axis=1), table, worst_of(table)])

        drawn = column_draws(columns, n, resamples=resamples, seed=seed)
        out[f"{spec['metric']}_avg"] = drawn[:, 0]
        out.update({name: drawn[:, 1 + j] for j, name in enumerate(names)})
        out[f"{spec['metric']}_wg"] = drawn[:, -1]
    return out


def face_intervals(dataset: str, positions: np.ndarray, predictions: dict[str, np.ndarray],
                   metadata: SampleMetadata, *, resamples: int = DEFAULT_RESAMPLES,
                   seed: int = 0) -> dict[str, tuple[float | None, float | None]]:
    """The 95% percentile-bootstrap interval of every face metric (:func:`face_draws`)."""
    from clipcache.tasks.score.intervals import percentile_interval

    return {metric: percentile_interval(drawn) for metric, drawn in
            face_draws(dataset, positions, predictions, metadata, resamples=resamples, seed=seed).items()}


def register(con: DuckDBPyConnection) -> None:
    """Add ``face_definitions`` and the face views (``experiment_metadata`` and ``sample_metadata`` must exist)."""
    con.execute("CREATE OR REPLACE TEMP TABLE face_definitions (dataset VARCHAR, metric VARCHAR, head VARCHAR, "
                "rule VARCHAR, class_code BIGINT, low BIGINT, high BIGINT, truth VARCHAR, by1 VARCHAR, by2 VARCHAR)")
    con.executemany("INSERT INTO face_definitions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", definitions())
    from clipcache.storage.sql_rules import create_view

    for model in ("stg_face_outcomes", "face_group_metrics", "face_metrics"):  # their dbt models' SQL
        create_view(con, model)
