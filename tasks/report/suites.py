"""Suites in the report: what the dbt project learns about them, and the intervals and ranks dbt cannot compute.

- :func:`suite_vars`: the shipped suites' datasets as the dbt var ``suite_datasets`` (one row per suite, dataset and
  metric part, the rows of the warehouse's ``suite_datasets`` table plus each dataset's position), from which the
  marts ``suite_results`` and ``suite_scores`` are built (dbt_reports/models/marts/suite_*.sql);
- :func:`write_suite_intervals`: the table ``suite_intervals`` beside those marts: per suite and complete model, the
  95% bootstrap intervals of the score and the normalised score, the rank and the models it is not separable from,
  computed by tasks/suites/scoring.py (``clipcache suite score``'s own code, with its default resamples and seed) over
  the warehouse's per-sample rows. A bootstrap over resampled sample rows is no SQL aggregate; computing it here
  keeps one implementation, so the report's intervals are the CLI's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clipcache.tasks.score.intervals import DEFAULT_RESAMPLES

INTERVAL_COLUMNS = ("suite VARCHAR, model VARCHAR, pretrained VARCHAR, checkpoint VARCHAR, precision VARCHAR, "
                    "rank INTEGER, score_ci_low DOUBLE, score_ci_high DOUBLE, normalized_ci_low DOUBLE, "
                    "normalized_ci_high DOUBLE, not_separable_from VARCHAR[], no_interval_because VARCHAR")


def suite_vars() -> dict[str, Any]:
    """``{"suite_datasets": [...]}`` for dbt's ``--vars``: every shipped suite's datasets, in suite order (the rows of
    the warehouse's ``suite_datasets`` table, tasks/suites/sql.py, with the tags as one text)."""
    from clipcache.tasks.suites import load_suite, shipped
    from clipcache.tasks.suites.sql import suite_rows

    return {"suite_datasets": [{**row, "tags": ", ".join(row["tags"])}
                               for row in suite_rows([load_suite(name) for name in shipped()])]}


def write_suite_intervals(database: Path, output_dir: str | Path, *, resamples: int = DEFAULT_RESAMPLES,
                          seed: int = 0) -> int:
    """Create ``suite_intervals`` in the built marts database (for the suites some model completes); returns its
    number of rows. Partial models get no row: they have no score, hence no interval and no rank."""
    import duckdb

    from clipcache.storage.warehouse import read_results
    from clipcache.tasks.suites import load_suite
    from clipcache.tasks.suites.scoring import score_suite

    con = duckdb.connect(str(database))
    try:
        complete = con.execute("SELECT suite, list(DISTINCT model) FROM suite_scores WHERE complete "
                               "GROUP BY suite ORDER BY suite").fetchall()
        rows = []
        if complete:
            suites = [(load_suite(name), list(models)) for name, models in complete]
            # one consistent view of the files (started over if `results compact` replaced them meanwhile)
            scored = read_results(output_dir, lambda warehouse: [
                (suite, score_suite(warehouse, suite, resamples=resamples, seed=seed, model_names=models))
                for suite, models in suites])
            for suite, scores in scored:
                for s in scores:
                    if not s.complete:
                        continue
                    why = sorted({f"{r.entry.dataset}: {r.why_no_draws}" for r in s.results if r.why_no_draws})
                    rows.append((suite.name, *s.model, s.rank, *s.score_ci, *s.normalized_ci,
                                 s.not_separable_from, "; ".join(why) or None))
        con.execute(f"CREATE OR REPLACE TABLE suite_intervals ({INTERVAL_COLUMNS})")
        if rows:
            con.executemany(f"INSERT INTO suite_intervals VALUES ({', '.join('?' for _ in rows[0])})", rows)
        con.execute("CHECKPOINT")
        return len(rows)
    finally:
        con.close()
