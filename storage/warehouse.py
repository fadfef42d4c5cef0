"""SQL over the results: a DuckDB connection with the views ``metrics`` and ``runs`` over the Parquet files.

DuckDB reads the Parquet files in place (no load step), so a query always sees every file published so far; files
being written have temporary names that the views' globs do not match.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from storage.results import METRIC_SCHEMA, RUN_SCHEMA, warehouse_dir


def _view(con: duckdb.DuckDBPyConnection, name: str, folder: Path, schema: pa.Schema) -> None:
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    if files:
        pattern = str(folder / "*.parquet").replace("'", "''")
        columns = ", ".join(schema.names)
        # Rows of files that a compacted file has absorbed are hidden (see storage/compaction.py).
        con.execute(f"""CREATE OR REPLACE VIEW {name} AS
            WITH files AS (SELECT * FROM read_parquet('{pattern}', union_by_name = true, filename = true))
            SELECT {columns} FROM files
            WHERE parse_filename(filename) NOT IN (SELECT source_file FROM files WHERE source_file IS NOT NULL)""")
    else:  # an empty, typed view, so queries work before the first run
        con.register(f"_{name}_empty", schema.empty_table())
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _{name}_empty")


def connect(output_dir: str | Path = "outputs", database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection where ``metrics`` and ``runs`` are the results under ``output_dir``."""
    con = duckdb.connect(database)
    root = warehouse_dir(output_dir)
    _view(con, "metrics", root / "metrics", METRIC_SCHEMA)
    _view(con, "runs", root / "runs", RUN_SCHEMA)
    return con
