"""Suites in SQL: a ``suite_datasets`` table of every shipped suite and the views ``suite_results`` (each model's
main metric per suite dataset, from the leaderboard) and ``suite_scores`` (the suite score per model: NULL unless
every dataset has a result, with the partial mean in its own column), and the group-metric views of
tasks/suites/groups.py over ``samples`` and ``sample_metadata``. Both suite views are the dbt marts of their names,
rendered over the warehouse (storage/sql_rules.py): one definition each. ``clipcache query`` and
``clipcache.connect`` add them; the bootstrap intervals and the rank check are in tasks/suites/scoring.py (``clipcache suite score``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clipcache.tasks.suites import Suite, load_suite, shipped

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

COLUMNS = ("suite", "dataset", "name", "task", "main_metric", "metric", "k", "chance", "split", "language", "tags",
           "runnable", "position")


def suite_rows(suites: list[Suite]) -> list[dict[str, Any]]:
    """One row per (suite, dataset, metric part) of ``suites`` (:data:`COLUMNS`): a main metric made of several
    metric rows (mean_recall@1: both directions' recall@1) has one row per part; ``position``: the dataset's place
    in its suite. The rows of the ``suite_datasets`` table here and of the dbt var ``suite_datasets``."""
    rows = []
    for suite in suites:
        for position, e in enumerate(suite.datasets):
            for metric, k in e.metric_parts():
                rows.append({"suite": suite.name, "dataset": e.dataset, "name": e.label, "task": e.task,
                             "main_metric": e.main_metric, "metric": metric, "k": k, "chance": e.chance,
                             "split": e.split, "language": e.language, "tags": list(e.tags),
                             "runnable": e.runnable, "position": position})
    return rows


def add_suite_datasets(con: DuckDBPyConnection, suites: list[Suite], table: str = "suite_datasets") -> None:
    """``table``: a temporary table of :func:`suite_rows` of ``suites``."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} (suite VARCHAR, dataset VARCHAR, name VARCHAR, "
                "task VARCHAR, main_metric VARCHAR, metric VARCHAR, k INTEGER, chance DOUBLE, split VARCHAR, "
                "language VARCHAR, tags VARCHAR[], runnable BOOLEAN, position INTEGER)")
    rows = [tuple(row[c] for c in COLUMNS) for row in suite_rows(suites)]
    if rows:  # one INSERT of every row: executemany runs a statement per row (0.29 s -> 0.04 s for the shipped 246)
        one = f"({', '.join('?' for _ in COLUMNS)})"
        con.execute(f"INSERT INTO {table} VALUES {', '.join(one for _ in rows)}", [v for row in rows for v in row])


def register(con: DuckDBPyConnection, extra: list[str] | None = None) -> None:
    """Add ``suite_datasets`` (every shipped suite, plus ``extra`` suite names or files) and the suite views."""
    from clipcache.storage.sql_rules import create_view

    add_suite_datasets(con, [load_suite(name) for name in [*shipped(), *(extra or [])]])
    create_view(con, "suite_results")  # the dbt marts' SQL (storage/sql_rules.py)
    create_view(con, "suite_scores")
    from clipcache.tasks.suites.groups import register as register_groups

    register_groups(con)  # group_definitions, experiment_metadata, sample_groups, group_accuracy, group_metrics
