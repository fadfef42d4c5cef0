"""SQL over the results: a DuckDB connection with the views ``metrics`` and ``runs`` over the Parquet files.

DuckDB reads the Parquet files in place (no load step). A connection's views cover the files published when it was
opened, minus those a compacted file has absorbed (storage/compaction.py); files being written have temporary names
and are never listed. Open a new connection to see runs that finished later.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from clipcache.storage.paths import AnyPath, is_remote, url
from clipcache.storage.results import METRIC_SCHEMA, RUN_SCHEMA, warehouse_dir


def visible_files(folder: AnyPath) -> list[AnyPath]:
    """Published result files whose rows are not already in a compacted file."""
    from clipcache.storage.compaction import covered_files

    if not folder.exists():
        return []
    hidden = covered_files(folder)
    return [f for f in sorted(folder.glob("*.parquet")) if f.name not in hidden]


def _view(con: duckdb.DuckDBPyConnection, name: str, folder: AnyPath, schema: pa.Schema) -> None:
    files = visible_files(folder)
    if files:
        paths = ", ".join("'" + url(f).replace("'", "''") + "'" for f in files)
        columns = ", ".join(schema.names)
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {columns} FROM read_parquet([{paths}], "
                    f"union_by_name = true)")
    else:  # an empty, typed view, so queries work before the first run
        con.register(f"_{name}_empty", schema.empty_table())
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _{name}_empty")


def connect(output_dir: str | Path = "outputs", database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection where ``metrics`` and ``runs`` are the results under ``output_dir``."""
    con = duckdb.connect(database)
    root = warehouse_dir(output_dir)
    if is_remote(root):  # DuckDB reads s3://, gs://, memory://... through the same fsspec filesystem we write with
        con.register_filesystem(root.fs)
    _view(con, "metrics", root / "metrics", METRIC_SCHEMA)
    _view(con, "runs", root / "runs", RUN_SCHEMA)
    return con
