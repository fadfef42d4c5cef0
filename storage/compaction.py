"""Merge many small result files into one, with no instant at which a query sees a row twice or not at all.

A compacted file carries a ``source_file`` column naming the file each row came from. The warehouse views drop the
rows of any file named there, so publishing the compacted file (one atomic rename) hides its sources at once; the
sources are deleted afterwards, and a crash in between only leaves files that are already hidden (the next
compaction deletes them first). Rows added by a concurrent run land in new files, which this compaction never saw
and does not touch.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from clipcache.storage.atomic import atomic_write
from clipcache.storage.results import METRIC_SCHEMA, RUN_SCHEMA, SOURCE_COLUMN, physical_schema, warehouse_dir

TABLES = {"metrics": METRIC_SCHEMA, "runs": RUN_SCHEMA}


@dataclass
class CompactionReport:
    table: str
    files_before: int
    files_after: int
    rows_before: int
    rows_after: int
    checksum_before: str
    checksum_after: str


def covered_files(folder: Path) -> set[str]:
    """Names of files whose rows live on in a compacted file."""
    names: set[str] = set()
    for f in folder.glob("compacted-*.parquet"):
        with f.open("rb") as fh:
            column = pq.read_table(fh, columns=[SOURCE_COLUMN]).column(SOURCE_COLUMN)
        names.update(v for v in pa.compute.unique(column).to_pylist() if v)
    return names


def table_checksum(output_dir: str | Path, table: str) -> tuple[int, str]:
    """(row count, order-independent checksum of every row) as queries see the table."""
    from clipcache.storage.warehouse import connect

    con = connect(output_dir)
    columns = ", ".join(TABLES[table].names)
    count, checksum = con.sql(f"SELECT count(*), coalesce(sum(hash({columns})::HUGEINT), 0) FROM {table}").fetchall()[0]
    return int(count), str(checksum)


def compact(output_dir: str | Path, table: str = "metrics") -> CompactionReport:
    folder = warehouse_dir(output_dir) / table
    folder.mkdir(parents=True, exist_ok=True)
    for name in covered_files(folder):  # leftovers of an interrupted compaction: already hidden by the views
        (folder / name).unlink(missing_ok=True)
    rows_before, checksum_before = table_checksum(output_dir, table)
    files = sorted(folder.glob("*.parquet"))
    if len(files) <= 1:
        return CompactionReport(table, len(files), len(files), rows_before, rows_before, checksum_before,
                                checksum_before)
    schema = physical_schema(TABLES[table])
    parts = []
    for f in files:
        with f.open("rb") as fh:
            part = pq.read_table(fh)
        if SOURCE_COLUMN in part.column_names:
            part = part.drop_columns([SOURCE_COLUMN])
        # Rows keep their immediate source: re-compacting a compacted file hides that file, whose own sources
        # were deleted before (covered files are removed first, above).
        part = part.append_column(SOURCE_COLUMN, pa.array([f.name] * len(part), pa.string()))
        parts.append(part.select(schema.names).cast(schema))
    merged = pa.concat_tables(parts)
    if "created_at" in merged.column_names:
        merged = merged.sort_by([("created_at", "ascending")])
    target = folder / f"compacted-{uuid.uuid4().hex[:12]}.parquet"
    atomic_write(target, lambda tmp: pq.write_table(merged, tmp, row_group_size=256_000))
    for f in files:
        f.unlink(missing_ok=True)
    rows_after, checksum_after = table_checksum(output_dir, table)
    return CompactionReport(table, len(files), len(list(folder.glob("*.parquet"))), rows_before, rows_after,
                            checksum_before, checksum_after)
