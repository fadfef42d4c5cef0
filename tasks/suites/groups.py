"""Group metrics: accuracy per group of a per-sample metadata field, the worst group, and WILDS' macro F1, computed in
SQL over the warehouse's sample rows joined with the ``sample_metadata`` table (storage/sample_metadata.py), so a
new grouping is a query, not a re-run.

DataComp's definitions (eval_utils/wilds_eval.py, fairness_eval.py over the ``wilds`` package's metrics), with its
metric names; which field each dataset is grouped by is data (tasks/datasets/datacomp/group_layouts.json, ``metrics``):

- per-group accuracy: top-1 (top-5) accuracy of the group's samples; a group without samples has no row;
- ``worst_acc1`` / ``worst_acc5`` (``acc_wg``, ``acc_worst_region``, ``acc_worst_year``, ``acc_top5_wg``): the
  lowest per-group accuracy over the groups that have samples (WILDS' ``worst`` over ``group_counts > 0``).
  DataComp's FMoW evaluator means to leave the region "Other" out, but it builds its groups without WILDS' names
  for the region codes, so its test never matches and every region with samples counts: so here;
- ``macro_f1`` (``F1-macro_all``): ``sklearn.metrics.f1_score(y_true, y_pred, average="macro",
  labels=unique(y_true))``: the mean over the classes present in the targets of 2 tp / (2 tp + fp + fn) (a class
  never predicted scores 0; a prediction of a class absent from the targets counts only as a miss of its target).

The evaluation computes them with the same SQL over the sample rows it writes (:func:`rule_metrics`: the
``group_metrics`` view, the dbt model's SQL) and stores them as ordinary metric rows, so the JSON, the leaderboard
and the suites have them; tests/test_group_metrics.py checks them against hand computations and scikit-learn.
Each row carries a 95% percentile-bootstrap interval (:func:`group_statistics`: the metric recomputed on index
resamples of the images, tasks/score/intervals.py ``GroupMeanStatistic`` and
``MacroF1Statistic``), and ``clipcache suite score`` resamples the same statistics from the warehouse's sample rows
and metadata (tasks/suites/scoring.py); tests/test_group_intervals.py checks both against a brute-force loop.

Views (added by :func:`register`, which tasks/suites/sql.py calls for ``clipcache query`` and ``clipcache.connect``);
each is the SQL of the dbt model named beside it, rendered over the warehouse's relations (storage/sql_rules.py), so
the views and the marts are one definition:

- ``group_definitions``: (dataset, metric, statistic, field) per DataComp group metric (a table, from the layouts);
- ``experiment_models``: (experiment_id, model, pretrained, checkpoint, precision) (stg_experiment_models);
- ``experiment_metadata``: (experiment_id, run_id, dataset_id, dataset, split): the metadata each experiment's
  latest run was scored with (stg_experiment_metadata);
- ``sample_groups``: one row per (image sample row, metadata field) of each experiment's latest run, with the
  field's ``code`` and ``label`` (stg_sample_groups);
- ``group_accuracy``: per (experiment, field, code): ``n``, ``acc1``, ``acc5`` and the model columns
  (group_accuracy);
- ``group_metrics``: per experiment, DataComp's group metrics by name (``metric``, ``value``, ``groups``), with
  FairFace's and UTKFace's (four heads per face: tasks/suites/face_attributes.py and its ``face_*`` views)
  (group_metrics).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.tasks.score.intervals import DEFAULT_RESAMPLES
from clipcache.tasks.suites import face_attributes

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

    from clipcache.storage.sample_metadata import SampleMetadata
    from clipcache.tasks.score.evidence import Evidence
    from clipcache.tasks.score.intervals import Statistic

STATISTICS = ("worst_acc1", "worst_acc5", "macro_f1")


def definitions() -> list[tuple[str, str, str, str | None]]:
    """(dataset, metric, statistic, field) of every DataComp group metric, from group_layouts.json."""
    from clipcache.tasks.datasets.datacomp.group_layouts import group_layouts

    return [(name, m["metric"], m["statistic"], m.get("field"))
            for name, entry in sorted(group_layouts().items()) for m in entry["metrics"]]


def dbt_vars() -> dict[str, Any]:
    """The dbt vars ``group_definitions`` and ``face_definitions`` (dbt_reports/macros/group_definitions.sql): the
    rows of the ``group_definitions`` and ``face_definitions`` tables, from which the group marts are built."""
    faces = ("dataset", "metric", "head", "rule", "class_code", "low", "high", "truth", "by1", "by2")
    return {"group_definitions": [dict(zip(("dataset", "metric", "statistic", "field"), row, strict=True))
                                  for row in definitions()],
            "face_definitions": [dict(zip(faces, row, strict=True)) for row in face_attributes.definitions()]}


def definition(dataset: str, metric: str) -> tuple[str, str | None] | None:
    """(statistic, field) of ``dataset``'s group metric ``metric``; None when it is not one."""
    for name, found, statistic, by in definitions():
        if name == dataset and found == metric:
            return statistic, by
    return None


@contextlib.contextmanager
def rule_connection(rows: dict[str, Any], metadata: SampleMetadata) -> Iterator[DuckDBPyConnection]:
    """An in-memory DuckDB holding one evaluation's sample rows as experiment ``e``'s ``latest_samples`` (``rows``:
    ``unit``, ``sample_index`` and, where the unit has them, ``target``, ``prediction``, ``correct1``,
    ``correct5``; the row of unit ``metadata`` linking ``metadata`` is added) and ``metadata`` as
    ``sample_metadata``, with the warehouse's group views (:func:`register`: the dbt models' SQL), so the evaluation
    computes its numbers with the rules the views and the marts use."""
    import duckdb
    import pyarrow as pa

    from clipcache.storage.experiment import LINK_UNIT

    index = np.asarray(rows["sample_index"], np.int64)
    n = len(index)

    def column(name: str, kind: type) -> list[Any]:
        values = rows.get(name)
        return [*([None] * n if values is None else np.asarray(values).astype(kind).tolist()), None]

    table = pa.table({"experiment_id": ["e"] * (n + 1), "run_id": ["r"] * (n + 1),
                      "unit": [*rows["unit"], LINK_UNIT], "sample_index": [*index.tolist(), 0],
                      "sample_key": [*(metadata.keys[i] for i in index), metadata.dataset_id],
                      "target": pa.array(column("target", np.int64), pa.int64()),
                      "prediction": pa.array(column("prediction", np.int64), pa.int64()),
                      "correct1": pa.array(column("correct1", bool), pa.bool_()),
                      "correct5": pa.array(column("correct5", bool), pa.bool_())})
    con = duckdb.connect(config={"threads": 1})  # a small query: threads would only contend with the encoders
    try:
        # one evaluation's rows are its experiment's latest by construction: registered as the latest_samples
        # relation itself (rendering the rule over them would sort them all for nothing)
        con.register("latest_samples", table)
        con.register("_metadata", metadata.table())
        con.execute("CREATE VIEW sample_metadata AS SELECT * FROM _metadata")
        con.execute("CREATE VIEW metrics AS SELECT NULL::VARCHAR AS experiment_id, NULL::VARCHAR AS model, "
                    "NULL::VARCHAR AS pretrained, NULL::VARCHAR AS checkpoint, NULL::VARCHAR AS precision "
                    "WHERE false")
        register(con)
        yield con
    finally:
        con.close()


def rule_metrics(dataset: str, rows: dict[str, Any], metadata: SampleMetadata) -> dict[str, float]:
    """The group metrics of one evaluation (DataComp's and the FairFace / UTKFace head metrics), computed by the
    warehouse's own ``group_metrics`` view over the sample rows it writes (:func:`rule_connection`): the numbers of
    the metric rows are those the views and the marts give, from one definition."""
    if not len(rows["sample_index"]):
        return {}
    with rule_connection(rows, metadata) as con:
        found = con.execute("SELECT metric, value FROM group_metrics WHERE dataset = ?", [dataset]).fetchall()
    return {metric: float(value) for metric, value in found}


def group_metrics(dataset: str, samples: dict[str, np.ndarray], metadata: SampleMetadata) -> dict[str, float]:
    """DataComp's group metrics of ``dataset`` from the evaluation's per-sample outcomes (``sample_index``,
    ``target``, ``prediction``, ``correct1``, ``correct5``) and the dataset's metadata (:func:`rule_metrics`)."""
    rows = {k: v for k, v in samples.items() if k in ("sample_index", "target", "prediction", "correct1", "correct5")}
    return rule_metrics(dataset, {**rows, "unit": ["image"] * len(samples["sample_index"])}, metadata)


def statistic(kind: str, samples: dict[str, np.ndarray], codes: np.ndarray | None) -> Statistic | None:
    """The bootstrap statistic of a group metric of ``kind`` (``worst_acc1``, ``worst_acc5``, ``macro_f1``) over
    the image samples (``target``, ``prediction``, ``correct1``, ``correct5``) with each sample's group ``codes``:
    on the identity index it is the metric (:func:`group_metrics`); None when the metric is not defined (top-5
    with fewer than 5 classes, no samples)."""
    from clipcache.tasks.score.intervals import macro_f1_statistic, worst_group_statistic

    if kind == "macro_f1":
        return macro_f1_statistic(samples["target"], samples["prediction"]) if len(samples["target"]) else None
    column = "correct1" if kind == "worst_acc1" else "correct5"
    if column not in samples or codes is None or not len(codes):
        return None
    return worst_group_statistic(np.asarray(samples[column], np.float64), codes)


def group_statistics(dataset: str, samples: dict[str, np.ndarray],
                     metadata: SampleMetadata) -> dict[str, Statistic]:
    """metric -> its bootstrap statistic over index resamples of the samples, for each group metric
    :func:`group_metrics` gives (the same samples, the same definitions)."""
    positions = np.asarray(samples["sample_index"], np.int64)
    out: dict[str, Statistic] = {}
    for name, metric, kind, by in definitions():
        if name != dataset:
            continue
        codes = metadata.codes[by][positions] if by is not None else None
        if (found := statistic(kind, samples, codes)) is not None:
            out[metric] = found
    return out


def attach(evidence: Evidence, metrics: dict[str, float], dataset: str, metadata: SampleMetadata,
           samples: dict[str, np.ndarray], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict[str, float]:
    """The metrics with the dataset's group metrics added, and their 95% bootstrap intervals in ``evidence``
    (``resamples`` index resamples of the images, seeded as the image metrics' are); ``evidence`` carries the
    metadata to write and a row of unit ``metadata`` naming it for the experiment."""
    from clipcache.storage.experiment import LINK_UNIT
    from clipcache.tasks.score.evidence import Evidence
    from clipcache.tasks.score.intervals import paired_draws, percentile_interval

    evidence.metadata = metadata
    evidence.more.append(Evidence(LINK_UNIT, {"sample_index": np.zeros(1, np.int64)}, [metadata.dataset_id]))
    n = len(samples["sample_index"])
    if resamples > 0 and n:
        for metric, found in group_statistics(dataset, samples, metadata).items():
            # index draws (never a shortcut): the draws a suite takes of the same statistic with the same seed
            evidence.intervals[metric] = percentile_interval(paired_draws(found, n, resamples=resamples, seed=seed))
    return {**metrics, **group_metrics(dataset, samples, metadata)}


# the views, in the order they read each other: each renders its dbt model (storage/sql_rules.py)
VIEWS = ("stg_experiment_models", "stg_experiment_metadata", "stg_sample_groups", "group_accuracy")


def register(con: DuckDBPyConnection) -> None:
    """Add ``group_definitions`` and the group views to a warehouse connection (one without a ``sample_metadata``
    view gets an empty one)."""
    from clipcache.storage.sql_rules import create_view

    present = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "sample_metadata" not in present:
        from clipcache.storage.sample_metadata import METADATA_SCHEMA

        con.register("_sample_metadata_empty", METADATA_SCHEMA.empty_table())
        con.execute("CREATE OR REPLACE VIEW sample_metadata AS SELECT * FROM _sample_metadata_empty")
    con.execute("CREATE OR REPLACE TEMP TABLE group_definitions (dataset VARCHAR, metric VARCHAR, "
                "statistic VARCHAR, field VARCHAR)")
    con.executemany("INSERT INTO group_definitions VALUES (?, ?, ?, ?)", definitions())
    for model in VIEWS:
        create_view(con, model)
    face_attributes.register(con)  # FairFace / UTKFace: face_definitions, face_outcomes, ..., face_metrics
    create_view(con, "group_metrics")
