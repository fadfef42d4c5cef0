"""Result files: evalscope-style JSON, clip_benchmark-style JSON and long-format Parquet metric rows.

Parquet layout under the output directory (append-only; each file is written to a temporary name and renamed, so a
query never sees half a file, and two runs never write the same file)::

    warehouse/metrics/<run_id>-<part>.parquet   one row per (run, model, dataset, split, language, task, metric, k)
    warehouse/runs/<run_id>.parquet             one row per run: configuration, versions, device, durations, status
"""

from __future__ import annotations

import io
import json
import math
import os
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from clipcache.storage.arrow_columns import from_numpy, list_array, string_lists, strings
from clipcache.storage.atomic import atomic_write, atomic_write_json
from clipcache.storage.paths import AnyPath, as_path

# Bump when a column changes meaning or is removed; adding a nullable column at the end does not need a bump.
# 2: the experiment's identity (experiment_id, checkpoint, precision, sample_limit, prompts, task options) and
#    tie counts; runs have a kind. Files of version 1 are rewritten by `clipcache results migrate`.
SCHEMA_VERSION = 2

METRIC_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("experiment_id", pa.string()),
    ("model", pa.string()),
    ("pretrained", pa.string()),
    ("checkpoint", pa.string()),
    ("model_fingerprint", pa.string()),
    ("dataset", pa.string()),
    ("split", pa.string()),
    ("language", pa.string()),
    ("task", pa.string()),
    ("precision", pa.string()),
    ("sample_limit", pa.int64()),
    ("prompts_sha256", pa.string()),
    ("default_prompts", pa.bool_()),
    ("task_options", pa.string()),
    ("metric", pa.string()),
    ("k", pa.int32()),
    ("value", pa.float64()),
    ("higher_is_better", pa.bool_()),
    ("n_samples", pa.int64()),
    ("tied_queries", pa.int64()),
    ("cache_keys", pa.list_(pa.string())),
    ("clipcache_version", pa.string()),
    ("schema_version", pa.int32()),
    # the metric's 95% interval: a seeded percentile bootstrap over its samples (null: not computed)
    ("ci_low", pa.float64()),
    ("ci_high", pa.float64()),
])

RUN_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("finished_at", pa.timestamp("us", tz="UTC")),
    ("status", pa.string()),
    ("kind", pa.string()),
    ("config", pa.string()),
    ("versions", pa.string()),
    ("device", pa.string()),
    ("durations", pa.string()),
    ("clipcache_version", pa.string()),
    ("schema_version", pa.int32()),
])


# One row per sample (or query) of an experiment: what its metrics are made of. Committed by the run row like the
# metric rows: the `samples` view shows the rows of completed runs only.
SAMPLE_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("experiment_id", pa.string()),
    ("task", pa.string()),
    ("unit", pa.string()),  # image (a classified image), caption / image_query (a retrieval query), class, ...
    ("sample_index", pa.int64()),  # position in the dataset's order (the same across experiments over the data)
    ("sample_key", pa.string()),  # the sample's own name where the dataset has one (file, shard key)
    ("target", pa.int64()),
    ("prediction", pa.int64()),
    ("top", pa.list_(pa.int32())),  # the best-scored classes (or items), best first
    ("correct1", pa.bool_()),
    ("correct5", pa.bool_()),
    ("rank", pa.int64()),  # 1 + the number of candidates scored above the target
    ("tied", pa.bool_()),
    ("score", pa.float64()),
    ("margin", pa.float64()),
    ("value", pa.float64()),
    ("schema_version", pa.int32()),
    # retrieval: the requested k at which the query is a hit, exactly as the stored recall@k counts it (its tie rule);
    # null in files written before it existed (they hold no retrieval rows)
    ("hits_at", pa.list_(pa.int32())),
    # captioning: the image's caption (generated, converted or a user's) and its reference captions, on every row of
    # the image; null in rows of other tasks and in files written before the columns existed
    ("caption", pa.string()),
    ("reference_captions", pa.list_(pa.string())),
])


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def json_safe_metrics(metrics: dict[str, float]) -> dict[str, float | None]:
    """NaN (e.g. acc5 with fewer than 5 classes) becomes JSON null, as DESIGN.md asks."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}


def write_json(path: AnyPath, payload: dict[str, Any]) -> AnyPath:
    path = as_path(path)
    atomic_write_json(path, payload)
    return path


# Physical files also carry `source_file`: null in files written by runs, the absorbed file's name in compacted
# files (storage/compaction.py). The `metrics` / `runs` views hide it.
SOURCE_COLUMN = "source_file"


def physical_schema(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field(SOURCE_COLUMN, pa.string()))


def _json_value(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


def rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows as an Arrow table of ``schema``, built through pyarrow's JSON reader: every pyarrow constructor from
    Python objects imports pandas, half a second of every CLI call. Floats round-trip exactly through JSON."""
    import pyarrow.json as pj

    lines = "\n".join(json.dumps({k: _json_value(v) for k, v in r.items()}, allow_nan=False) for r in rows)
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    return pj.read_json(io.BytesIO(lines.encode("utf-8")), parse_options=options).select(schema.names)


def _write_table(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> Path:
    table = rows_to_table([{**r, SOURCE_COLUMN: None} for r in rows], physical_schema(schema))
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return path


def warehouse_dir(output_dir: str | os.PathLike) -> AnyPath:
    """``<output_dir>/warehouse``; ``output_dir`` may be an fsspec URL (storage/paths.py)."""
    return as_path(output_dir) / "warehouse"


def write_metric_rows(output_dir: str | Path, run_id: str, rows: list[dict[str, Any]]) -> Path:
    path = warehouse_dir(output_dir) / "metrics" / f"{run_id}-{uuid.uuid4().hex[:8]}.parquet"
    return _write_table(path, [{**r, "schema_version": SCHEMA_VERSION} for r in rows], METRIC_SCHEMA)


def write_run_row(output_dir: str | Path, row: dict[str, Any]) -> Path:
    row = {**row, "schema_version": SCHEMA_VERSION}
    for field in ("config", "versions", "durations"):
        if not isinstance(row.get(field), str):
            row[field] = json.dumps(row.get(field), sort_keys=True, default=str)
    path = warehouse_dir(output_dir) / "runs" / f"{row['run_id']}.parquet"
    return _write_table(path, [row], RUN_SCHEMA)


def write_sample_rows(output_dir: str | Path, run_id: str, *, created_at: datetime, experiment_id: str, task: str,
                      unit: str, columns: dict[str, Any], keys: list[str] | None = None) -> Path:
    """Per-sample outcomes (NumPy arrays by column; a masked array's masked entries are nulls; a list column is a
    2-D array or a :class:`Ragged`; a text column a list of str, a list-of-texts column a list of lists of str) as
    one Parquet file, Arrow built on the arrays' buffers."""
    import numpy as np

    n = len(next(iter(columns.values())))
    micros = int(created_at.timestamp() * 1_000_000)
    fixed = {"run_id": strings([run_id] * n), "experiment_id": strings([experiment_id] * n),
             "task": strings([task] * n), "unit": strings([unit] * n),
             "created_at": from_numpy(np.full(n, micros, dtype=np.int64), pa.int64()).view(
                 pa.timestamp("us", tz="UTC")),
             "sample_index": from_numpy(columns["sample_index"] if "sample_index" in columns else np.arange(n),
                                         pa.int64()),
             "sample_key": strings(keys) if keys is not None else pa.nulls(n, pa.string()),
             "schema_version": from_numpy(np.full(n, SCHEMA_VERSION), pa.int32())}
    arrays = []
    for field in physical_schema(SAMPLE_SCHEMA):
        if field.name in fixed:
            arrays.append(fixed[field.name])
        elif field.type == pa.list_(pa.string()) and field.name in columns:
            arrays.append(string_lists(columns[field.name]))
        elif pa.types.is_list(field.type) and field.name in columns:
            arrays.append(list_array(columns[field.name]))
        elif pa.types.is_string(field.type) and field.name in columns:
            arrays.append(strings(list(columns[field.name])))
        elif field.name in columns:
            arrays.append(from_numpy(columns[field.name], field.type))
        else:
            arrays.append(pa.nulls(n, field.type))
    table = pa.Table.from_arrays(arrays, schema=physical_schema(SAMPLE_SCHEMA))
    path = warehouse_dir(output_dir) / "samples" / f"{run_id}-{uuid.uuid4().hex[:8]}.parquet"
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return path


TABLES = {"metrics": METRIC_SCHEMA, "runs": RUN_SCHEMA, "samples": SAMPLE_SCHEMA}
# The columns of schema version 1 (clipcache 0.1): a migration keeps every one of them unchanged.
V1_COLUMNS = {
    "metrics": ("run_id", "created_at", "model", "pretrained", "model_fingerprint", "dataset", "split", "language",
                "task", "metric", "k", "value", "higher_is_better", "n_samples", "cache_keys", "clipcache_version"),
    "samples": ("run_id", "created_at", "experiment_id", "task", "unit", "sample_index"),  # new in version 2
    "runs": ("run_id", "created_at", "finished_at", "status", "config", "versions", "device", "durations",
             "clipcache_version"),
}


COMPACTED_PREFIX = "compacted-"


def _compacted_sources(path: AnyPath, table: str) -> tuple[set[str], str | None]:
    """(names of the files whose rows a compacted file holds, why it cannot be read as one or None). A compacted
    file is checked like any other result file first: its ``source_file`` column decides which files the views
    hide, so only a file of the table's schema may decide it."""
    problem = _schema_problem(path, table)
    if problem:
        return set(), problem
    try:
        with path.open("rb") as fh:
            parquet = pq.ParquetFile(fh)
            if SOURCE_COLUMN not in parquet.schema_arrow.names:
                return set(), None  # covers nothing: read as a file of its own
            column = parquet.read(columns=[SOURCE_COLUMN]).column(SOURCE_COLUMN)
    except (OSError, pa.ArrowException) as e:
        return set(), f"{path}: not a readable Parquet file ({_one_line(e)})"
    if not pa.types.is_string(column.type):
        return set(), f"{path}: not a clipcache {table} file (column {SOURCE_COLUMN} is {column.type}, not string)"
    counts = {row["values"]: row["counts"] for row in pc.value_counts(column).to_pylist() if row["values"]}
    # A file it names that is still there (a compaction interrupted before its sources went) must be one it holds
    # whole, row for row: one that names files it does not hold would hide, and `results compact` would delete,
    # rows it does not have.
    present = [name for name in sorted(counts) if (path.parent / name).exists()]
    if present:
        try:
            with path.open("rb") as fh:
                held = pq.read_table(fh)
        except (OSError, pa.ArrowException) as e:
            return set(), f"{path}: not a readable Parquet file ({_one_line(e)})"
        for name in present:
            if not _holds(held, path.parent / name, name, table):
                return set(), f"{path}: names {name} as absorbed but does not hold its rows (not a compaction of " \
                              f"this warehouse)"
    return set(counts), None


def _holds(compacted: pa.Table, source: AnyPath, name: str, table: str) -> bool:
    """Whether ``compacted`` holds exactly the rows of ``source`` (over the columns every schema has)."""
    try:
        with source.open("rb") as fh:
            rows = pq.read_table(fh)
    except (OSError, pa.ArrowException):
        return True  # the source's own problem is named when it is read
    columns = [c for c in V1_COLUMNS[table] if c in rows.column_names and c in compacted.column_names]
    mine = compacted.filter(pc.equal(compacted.column(SOURCE_COLUMN), name))
    if len(mine) != len(rows):
        return False

    def key(t: pa.Table) -> list[str]:
        return sorted(repr(r) for r in t.select(columns).to_pylist())

    return key(mine) == key(rows)


def _table_of(folder: AnyPath, table: str | None) -> str:
    return table or folder.name


def published_files(folder: AnyPath, table: str | None = None) -> tuple[list[AnyPath], list[str]]:
    """(the files the views read: published, not absorbed by a compacted file, and no compacted file that cannot be
    read as one; the problems of the compacted files left out). ``table`` defaults to the folder's name."""
    if not folder.exists():
        return [], []
    table = _table_of(folder, table)
    files = sorted(folder.glob("*.parquet"))
    hidden: set[str] = set()
    bad: dict[str, str] = {}
    for f in files:
        if f.name.startswith(COMPACTED_PREFIX):
            names, problem = _compacted_sources(f, table)
            hidden |= names
            if problem:
                bad[f.name] = problem
    return [f for f in files if f.name not in hidden and f.name not in bad], list(bad.values())


def covered_files(folder: AnyPath, table: str | None = None) -> set[str]:
    """Names of files whose rows live on in a compacted file (storage/compaction.py). A compacted file that is not
    one of ``table``'s (default: the folder's name) covers nothing."""
    names: set[str] = set()
    if not folder.exists():
        return names
    for f in folder.glob(f"{COMPACTED_PREFIX}*.parquet"):
        names |= _compacted_sources(f, _table_of(folder, table))[0]
    return names


def visible_files(folder: AnyPath, table: str | None = None) -> list[AnyPath]:
    """Published result files whose rows are not already in a compacted file (temporary files are never listed);
    a foreign or damaged compacted file is listed, for :func:`file_problem` to name."""
    if not folder.exists():
        return []
    hidden = covered_files(folder, table)
    return [f for f in sorted(folder.glob("*.parquet")) if f.name not in hidden]


# schema_version: every release wrote it (tests/fixtures/warehouse_release_0_1), and `schema_versions` reads it.
REQUIRED_COLUMNS = {"metrics": {"run_id", "model", "dataset", "task", "metric", "value", "schema_version"},
                    "samples": {"run_id", "experiment_id", "unit", "sample_index", "schema_version"},
                    "runs": {"run_id", "status", "created_at", "schema_version"}}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _schema_problem(path: AnyPath, table: str) -> str | None:
    try:
        with path.open("rb") as fh:
            schema = pq.read_schema(fh)
    except (OSError, pa.ArrowException) as e:
        return f"{path}: not a readable Parquet file ({_one_line(e)})"
    if len(set(schema.names)) < len(schema.names):
        return f"{path}: not a clipcache {table} file (a column name occurs twice)"
    missing = REQUIRED_COLUMNS[table] - set(schema.names)
    if missing:
        return f"{path}: not a clipcache {table} file (no column {', '.join(sorted(missing))})"
    version = schema.field("schema_version").type
    if not pa.types.is_integer(version):
        return f"{path}: not a clipcache {table} file (column schema_version is {version}, not an integer)"
    return None


def file_problem(path: AnyPath, table: str) -> str | None:
    """Why a result file cannot be part of ``table`` (unreadable, not Parquet, foreign columns, a compacted file
    whose list of absorbed files cannot be read), or None."""
    if path.name.startswith(COMPACTED_PREFIX):
        return _compacted_sources(path, table)[1]
    return _schema_problem(path, table)


def schema_versions(path: AnyPath) -> set[int]:
    with path.open("rb") as fh:
        table = pq.read_table(fh, columns=["schema_version"])
    return {int(v) for v in pc.unique(table.column("schema_version")).to_pylist() if v is not None}
