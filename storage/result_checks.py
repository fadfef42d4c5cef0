"""`clipcache results verify`: every result file that cannot be part of the warehouse, every file written by an older
release, and the metric rows that no view counts (their run failed, or was killed before writing its run row)."""

from __future__ import annotations

import os

from clipcache.storage.results import TABLES, file_problem, schema_versions, visible_files, warehouse_dir
from clipcache.storage.warehouse import open_warehouse


def verify_results(output_dir: str | os.PathLike) -> tuple[list[str], list[str]]:
    """(problems: files to repair or move away, notes: rows no view counts, which are harmless)."""
    problems: list[str] = []
    notes: list[str] = []
    root = warehouse_dir(output_dir)
    for table in TABLES:
        for f in visible_files(root / table):
            problem = file_problem(f, table)
            if problem:
                problems.append(problem)
            elif schema_versions(f) != {2}:
                problems.append(f"{f}: written by an older clipcache (run `clipcache results migrate`)")
        for leftover in sorted((root / table).glob(".*.tmp")) if (root / table).exists() else []:
            problems.append(f"{leftover}: a temporary file of an interrupted write (safe to delete)")
    if problems:
        return problems, notes
    con = open_warehouse(output_dir).con
    for run_id, status, rows in con.sql(
            "SELECT run_id, status, count(*) FROM metrics_all WHERE status IS DISTINCT FROM 'completed' "
            "GROUP BY ALL ORDER BY run_id").fetchall():
        why = "has no run row (killed before it ended)" if status is None else f"is {status}"
        notes.append(f"run {run_id} {why}: its {rows} metric rows are not counted anywhere")
    return problems, notes
