"""Suites in SQL: a ``suite_datasets`` table of every shipped suite and the views ``suite_results`` (each model's
main metric per suite dataset, from the leaderboard) and ``suite_scores`` (the suite score per model: NULL unless
every dataset has a result, with the partial mean in its own column), and the group-metric views of
tasks/suites/groups.py over ``samples`` and ``sample_metadata``. ``clipcache query`` and ``clipcache.connect`` add
them; the bootstrap intervals and the rank check are in tasks/suites/scoring.py (``clipcache suite score``)."""

from __future__ import annotations

from typing import Any

from clipcache.tasks.suites import Suite, load_suite, shipped

COLUMNS = ("suite", "dataset", "name", "task", "main_metric", "metric", "k", "chance", "split", "language", "tags",
           "runnable")

SUITE_RESULTS = """
CREATE OR REPLACE VIEW suite_results AS
WITH parts AS (
    SELECT *, count(*) OVER (PARTITION BY suite, dataset, split, language) AS n_parts FROM suite_datasets),
matched AS (
    SELECT p.suite, p.dataset, p.name, p.main_metric, p.chance, p.n_parts, l.model, l.pretrained, l.checkpoint,
           l.precision, l.value, l.experiment_id
    FROM parts p JOIN leaderboard l
      ON l.dataset = p.dataset AND l.split = p.split AND l.language = p.language AND l.metric = p.metric
     AND l.k IS NOT DISTINCT FROM p.k AND (p.task = 'auto' OR l.task = p.task))
SELECT suite, dataset, name, main_metric, chance, model, pretrained, checkpoint, precision, avg(value) AS value,
       min(experiment_id) AS experiment_id
FROM matched
GROUP BY suite, dataset, name, main_metric, chance, model, pretrained, checkpoint, precision
HAVING count(*) = min(n_parts) AND count(DISTINCT experiment_id) = 1
"""

SUITE_SCORES = """
CREATE OR REPLACE VIEW suite_scores AS
WITH sizes AS (  -- an entry is a (dataset, split, language): one dataset in two languages is two entries
    SELECT suite, count(*) AS n_datasets FROM (SELECT DISTINCT suite, dataset, split, language FROM suite_datasets)
    GROUP BY suite),
agg AS (
    SELECT suite, model, pretrained, checkpoint, precision, count(*) AS n_present, avg(value) AS mean_present,
           avg((value - chance) / (1 - chance)) AS normalized_present, count(chance) AS n_with_chance
    FROM suite_results GROUP BY suite, model, pretrained, checkpoint, precision)
SELECT a.suite, a.model, a.pretrained, a.checkpoint, a.precision, a.n_present AS datasets_present,
       s.n_datasets AS datasets, a.n_present = s.n_datasets AS complete,
       CASE WHEN a.n_present = s.n_datasets THEN a.mean_present END AS score,
       CASE WHEN a.n_present = s.n_datasets AND a.n_with_chance = a.n_present THEN a.normalized_present END
           AS normalized,
       CASE WHEN a.n_present < s.n_datasets THEN a.mean_present END AS partial_score
FROM agg a JOIN sizes s USING (suite)
"""


def suite_rows(suites: list[Suite]) -> list[tuple[Any, ...]]:
    rows = []
    for suite in suites:
        for e in suite.datasets:
            for metric, k in e.metric_parts():
                rows.append((suite.name, e.dataset, e.label, e.task, e.main_metric, metric, k, e.chance, e.split,
                             e.language, list(e.tags), e.runnable))
    return rows


def register(con: Any, extra: list[str] | None = None) -> None:
    """Add ``suite_datasets`` (every shipped suite, plus ``extra`` suite names or files) and the suite views."""
    suites = [load_suite(name) for name in [*shipped(), *(extra or [])]]
    con.execute("CREATE OR REPLACE TEMP TABLE suite_datasets (suite VARCHAR, dataset VARCHAR, name VARCHAR, "
                "task VARCHAR, main_metric VARCHAR, metric VARCHAR, k INTEGER, chance DOUBLE, split VARCHAR, "
                "language VARCHAR, tags VARCHAR[], runnable BOOLEAN)")
    rows = suite_rows(suites)
    if rows:
        con.executemany(f"INSERT INTO suite_datasets VALUES ({', '.join('?' for _ in COLUMNS)})", rows)
    con.execute(SUITE_RESULTS)
    con.execute(SUITE_SCORES)
    from clipcache.tasks.suites.groups import register as register_groups

    register_groups(con)  # group_definitions, experiment_metadata, sample_groups, group_accuracy, group_metrics
