"""Merge many small result files into one, with no instant at which a query sees a row twice or not at all.

A compacted file carries a ``source_file`` column naming the file each row came from. The warehouse views drop the
rows of any file named there, so publishing the compacted file (one atomic rename) hides its sources at once; the
sources are deleted afterwards, and a crash in between only leaves files that are already hidden (the next
compaction deletes them first). Rows added by a concurrent run land in new files, which this compaction never saw
and does not touch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from clipcache.storage.atomic import atomic_write
from clipcache.storage.errors import ResultsError
from clipcache.storage.results import (
    SCHEMA_VERSION,
    SOURCE_COLUMN,
    TABLES,
    V1_COLUMNS,
    covered_files,
    file_problem,
    physical_schema,
    schema_versions,
    warehouse_dir,
)
from clipcache.storage.warehouse import open_warehouse

Upgrade = Callable[[str, pa.Table], pa.Table]  # (table, rows in an older schema) -> rows in the current one


@dataclass
class CompactionReport:
    table: str
    files_before: int
    files_after: int
    rows_before: int
    rows_after: int
    checksum_before: str
    checksum_after: str


def table_checksum(output_dir: str | Path, table: str, columns: tuple[str, ...] | None = None) -> tuple[int, str]:
    """(row count, order-independent checksum of every row) as queries see the table (every row, whatever its run's
    status); ``columns`` limits the checksum to those columns."""
    con = open_warehouse(output_dir).con
    view = "_metric_rows" if table == "metrics" else table
    return _checksum(con, view, columns or TABLES[table].names)


def _checksum(con: duckdb.DuckDBPyConnection, relation: str, columns: tuple[str, ...] | list[str]) -> tuple[int, str]:
    names = ", ".join(columns)
    count, checksum = con.sql(f"SELECT count(*), coalesce(sum(hash({names})::HUGEINT), 0) FROM {relation}").fetchall()[0]
    return int(count), str(checksum)


def _files_checksum(parts: list[pa.Table], columns: tuple[str, ...] | list[str]) -> tuple[int, str]:
    con = duckdb.connect()
    con.register("_rows", pa.concat_tables([p.select(list(columns)) for p in parts]) if parts else
                 pa.table({c: [] for c in columns}))
    return _checksum(con, "_rows", columns)


def compact(output_dir: str | Path, table: str = "metrics", upgrade: Upgrade | None = None) -> CompactionReport:
    """Merge every published file of ``table`` into one; rows written meanwhile land in new files, which this
    compaction never sees. Files of an older schema are rewritten by ``upgrade`` (`clipcache results migrate`);
    without it they are an error. The rows and their checksum (over the columns every schema has) are checked to be
    the same in the sources and in the compacted file before the sources go."""
    folder = warehouse_dir(output_dir) / table
    folder.mkdir(parents=True, exist_ok=True)
    for name in covered_files(folder):  # leftovers of an interrupted compaction: already hidden by the views
        (folder / name).unlink(missing_ok=True)
    files = sorted(folder.glob("*.parquet"))
    problems = [p for p in (file_problem(f, table) for f in files) if p]
    if problems:
        raise ResultsError(f"{problems[0]}; move it out of the warehouse first (`clipcache results verify` lists "
                           f"every such file)")
    old = [f for f in files if schema_versions(f) != {SCHEMA_VERSION}]
    if old and upgrade is None:
        raise ResultsError(f"{old[0]} was written by an older clipcache (schema {sorted(schema_versions(old[0]))}); "
                           f"run `clipcache results migrate --output_dir {output_dir}` first")
    check = V1_COLUMNS[table]
    schema = physical_schema(TABLES[table])
    sources, parts = [], []
    for f in files:
        with f.open("rb") as fh:
            part = pq.read_table(fh)
        if SOURCE_COLUMN in part.column_names:
            part = part.drop_columns([SOURCE_COLUMN])
        sources.append(part)
        if f in old and upgrade is not None:
            part = upgrade(table, part)
        # Rows keep their immediate source: re-compacting a compacted file hides that file, whose own sources
        # were deleted before (covered files are removed first, above).
        part = part.append_column(SOURCE_COLUMN, pa.array([f.name] * len(part), pa.string()))
        for field in schema:  # nullable columns added since the file was written (ci_low, ci_high) read as nulls
            if field.name not in part.column_names:
                part = part.append_column(field, pa.nulls(len(part), field.type))
        parts.append(part.select(schema.names).cast(schema))
    rows_before, checksum_before = _files_checksum(sources, check)
    if len(files) <= 1 and not old:
        return CompactionReport(table, len(files), len(files), rows_before, rows_before, checksum_before,
                                checksum_before)
    merged = pa.concat_tables(parts)
    if "created_at" in merged.column_names:
        merged = merged.sort_by([("created_at", "ascending")])
    rows_after, checksum_after = _files_checksum([merged], check)
    if (rows_before, checksum_before) != (rows_after, checksum_after):
        raise ResultsError(f"compaction of {table} would change the data ({rows_before} rows / {checksum_before} "
                           f"before, {rows_after} / {checksum_after} after); nothing was changed")
    target = folder / f"compacted-{uuid.uuid4().hex[:12]}.parquet"
    atomic_write(target, lambda tmp: pq.write_table(merged, tmp, row_group_size=256_000))
    for f in files:
        f.unlink(missing_ok=True)
    return CompactionReport(table, len(files), len(list(folder.glob("*.parquet"))), rows_before, rows_after,
                            checksum_before, checksum_after)
