"""Run the dbt_reports project (dbt-duckdb) over an output directory's Parquet results."""

from __future__ import annotations

import os
from pathlib import Path

from clipcache.storage.errors import ResultsError

PROJECT_DIR = Path(__file__).resolve().parents[2] / "dbt_reports"


def dbt_build(output_dir: str | Path, work_dir: str | Path | None = None) -> Path:
    """``dbt build`` (models + data tests + unit tests) into ``<output_dir>/report/reports.duckdb``; returns it."""
    import json

    from dbt.cli.main import dbtRunner

    from clipcache.storage.results import schema_versions, visible_files, warehouse_dir
    from clipcache.tasks.evaluation import dbt_vars

    for table in ("metrics", "runs"):
        old = [f for f in visible_files(warehouse_dir(output_dir) / table) if schema_versions(f) != {2}]
        if old:
            raise ResultsError(f"{old[0]} was written by an older clipcache: run `clipcache results migrate "
                               f"--output_dir {output_dir}` first")

    output_dir = Path(output_dir).resolve()
    work = Path(work_dir).resolve() if work_dir else output_dir / "report"
    work.mkdir(parents=True, exist_ok=True)
    database = work / "reports.duckdb"
    env = {"DBT_SEND_ANONYMOUS_USAGE_STATS": "False",  # its only network call
           "CLIPCACHE_WAREHOUSE": str(output_dir / "warehouse"), "CLIPCACHE_DBT_DATABASE": str(database)}
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        result = dbtRunner().invoke(["build", "--project-dir", str(PROJECT_DIR), "--profiles-dir", str(PROJECT_DIR),
                                     "--target-path", str(work / "dbt_target"), "--log-path", str(work / "dbt_logs"),
                                     "--vars", json.dumps(dbt_vars()), "--quiet"])
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if not result.success:
        failures = []
        for r in getattr(result.result, "results", None) or []:
            if str(r.status) not in ("success", "pass"):
                failures.append(f"{r.node.name}: {r.status} {r.message or ''}".strip())
        detail = "; ".join(failures) or str(result.exception)
        raise ResultsError(f"dbt build failed ({detail}); logs in {work / 'dbt_logs'}")
    return database
