"""SQL over the results: a DuckDB connection whose views are the Parquet files under ``<output_dir>/warehouse``.

Views:

- ``runs``: one row per run (status ``completed`` or ``failed``); a run row is written last, when the run ends.
- ``metrics``: the metric rows of completed runs: a run's rows become visible together with its run row, and rows of
  failed or killed runs never count.
- ``metrics_all``: every metric row with its run's ``status`` (null: no run row, i.e. killed before it ended).
- ``leaderboard``: per (model, checkpoint, dataset, split, language, task, precision), every metric row of the
  latest completed reference run: full data (no sample limit), the dataset's own prompts, default task settings.
  Whole runs are chosen, not metric by metric, so a metric that the latest run no longer computes (recall@50 after
  ``--recall_k 1 5``) does not linger from an older run; dbt's ``latest_metrics`` mart uses the same rule.
  Limited runs and what-ifs stay in ``metrics`` with their options as columns and never reach it. The view is
  that mart's SQL rendered over ``metrics`` (storage/sql_rules.py): the rule is written once.
- ``samples``: the sample rows of completed runs; ``latest_samples``: per experiment, those of its latest completed
  run (dbt's ``stg_latest_samples`` model rendered over ``samples``, the one definition of that choice).

DuckDB reads the files in place (no load step). A connection sees the files published when it was opened, minus
those a compacted file has absorbed (storage/compaction.py). ``read_only=True`` (what ``clipcache query`` uses)
allows only SELECT statements, and DuckDB itself may read no file outside the warehouse, write nothing and change no
setting, so a query tool wired into dashboards can read the results and nothing else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb
import pyarrow as pa

from clipcache.storage.errors import ClipcacheError, ConfigError, ResultsError
from clipcache.storage.paths import AnyPath, as_path, is_remote, owning_store, url
from clipcache.storage.results import (
    COMPACTED_PREFIX,
    TABLES,
    file_problem,
    physical_schema,
    published_files,
    warehouse_dir,
)
from clipcache.storage.sample_metadata import register_view as register_metadata_view
from clipcache.storage.sql_rules import create_view

# A leaderboard entry: one latest reference run is chosen per (model, checkpoint, dataset, split, language, task,
# precision): dbt_reports/models/marts/latest_metrics.sql, the one definition of that choice
LEADERBOARD_COLUMNS = ("model", "pretrained", "checkpoint", "dataset", "split", "language", "task", "precision",
                       "metric", "k", "value", "ci_low", "ci_high", "n_samples", "tied_queries", "run_id", "created_at",
                       "experiment_id")
ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN")


# How often a read starts over when `results compact` replaced the files it was reading (each compaction replaces
# them once; a read that loses this many races in a row reports it in one line).
READ_ATTEMPTS = 50
T = TypeVar("T")


class FilesMoved(Exception):
    """The files a connection lists were replaced by a compaction while it was being opened (internal: retried)."""


class Warehouse:
    """A connection plus what was found while opening it (files left out because they cannot be read)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, damaged: dict[str, list[str]],
                 files: list[AnyPath] | None = None):
        self.con = con
        self.damaged = damaged  # table -> problems, one line each
        self.files = files or []  # every file the views read

    def moved(self) -> bool:
        """True when a file the views read is gone: `results compact` (or `migrate`) replaced it since the
        connection was opened, and its rows now live in a newer file (storage/compaction.py)."""
        return any(not f.exists() for f in self.files)

    def problems_for(self, sql: str) -> list[str]:
        """Damaged files of the tables ``sql`` reads (the views built on metrics read the metric files)."""
        text = sql.lower()
        uses = {"metrics": any(v in text for v in ("metrics", "leaderboard")),
                "runs": any(v in text for v in ("runs", "metrics", "leaderboard", "samples")),
                "samples": "samples" in text}
        return [p for table, problems in self.damaged.items() if uses[table] for p in problems]


def _quoted(files: list[AnyPath]) -> str:
    return ", ".join("'" + url(f).replace("'", "''") + "'" for f in files)


DUCKDB_TYPES = {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float64(): "DOUBLE",
                pa.bool_(): "BOOLEAN", pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ", pa.list_(pa.string()): "VARCHAR[]",
                pa.list_(pa.int32()): "INTEGER[]"}


def _table_view(con: duckdb.DuckDBPyConnection, name: str, folder: AnyPath, listed: list[AnyPath]) -> list[str]:
    """``CREATE VIEW name`` over the table's readable files (added to ``listed``); returns the problems of files it
    had to leave out. Columns that no file has yet (files of an older release) read as typed nulls. FilesMoved when
    a compaction removed a listed file meanwhile (its rows are in a file this listing may not have)."""
    schema: pa.Schema = TABLES[name]
    known = set(physical_schema(schema).names)
    # the compacted files present before listing (damaged ones included): a later one means a compaction ran meanwhile
    listed += folder.glob(f"{COMPACTED_PREFIX}*.parquet") if folder.exists() else []
    files, problems = published_files(folder, name)
    if problems and _any_gone(folder, problems):
        raise FilesMoved(name)
    listed += files  # every file the view may read (those found damaged below are left out of the view only)
    checked = False
    while files:
        error: duckdb.Error | None = None
        present: set[str] = set()
        try:
            con.execute(f"CREATE OR REPLACE VIEW _{name}_files AS SELECT * FROM read_parquet([{_quoted(files)}], "
                        f"union_by_name = true)")
            present = {row[0] for row in con.sql(f"DESCRIBE _{name}_files").fetchall()}
        except duckdb.Error as e:
            error = e
        if error is not None and any(not f.exists() for f in files):
            raise FilesMoved(name) from error
        # Find the culprits only now (in the common case no file is read twice): DuckDB could not read the files,
        # or one of them has a column clipcache never writes (a foreign file, whose rows would read as nulls).
        if not checked and (error is not None or present - known):
            checked = True
            found = [(f, file_problem(f, name)) for f in files]
            if any(p for _, p in found):
                problems += [p for _, p in found if p]
                files = [f for f, p in found if p is None]
                continue
        if error is not None:
            raise ResultsError(f"cannot read the {name} files under {folder} "
                               f"({str(error).strip().splitlines()[0]})") from error
        columns = ", ".join(f.name if f.name in present else f"CAST(NULL AS {DUCKDB_TYPES[f.type]}) AS {f.name}"
                            for f in schema)
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {columns} FROM _{name}_files")
        return problems
    con.register(f"_{name}_empty", schema.empty_table())  # a typed empty view: queries work before any run
    con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _{name}_empty")
    return problems


def _derived_views(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER VIEW metrics RENAME TO _metric_rows")
    con.execute("CREATE VIEW metrics_all AS SELECT m.*, r.status FROM _metric_rows m LEFT JOIN runs r USING (run_id)")
    con.execute("CREATE VIEW metrics AS SELECT m.* FROM _metric_rows m SEMI JOIN "
                "(SELECT run_id FROM runs WHERE status = 'completed') USING (run_id)")
    con.execute("ALTER VIEW samples RENAME TO _sample_rows")
    con.execute("CREATE VIEW samples AS SELECT s.* FROM _sample_rows s SEMI JOIN "
                "(SELECT run_id FROM runs WHERE status = 'completed') USING (run_id)")
    # the sample rows of each experiment's latest completed run: dbt's stg_latest_samples model rendered over
    # `samples` (the one definition; flips and compares read this view), and the samples two experiments disagree on
    create_view(con, "stg_latest_samples")
    # per unit (an image, a text or image query, a selection item): rows of other units share sample indices
    con.execute("CREATE MACRO sample_flips(baseline, candidate) AS TABLE "
                "SELECT unit, a.sample_index, a.sample_key, a.target, a.prediction AS baseline_prediction, "
                "b.prediction AS candidate_prediction, a.correct1 AS baseline_correct1, "
                "b.correct1 AS candidate_correct1 FROM latest_samples a JOIN latest_samples b "
                "USING (unit, sample_index) "
                "WHERE a.experiment_id = baseline AND b.experiment_id = candidate AND a.correct1 <> b.correct1 "
                "ORDER BY unit, a.sample_index")
    # captioning: two experiments' captions of each image side by side, with each side's per-image value of the unit's
    # metric (unit caption_cider: CIDEr), the references of the baseline's rows
    con.execute("CREATE MACRO caption_pairs(baseline, candidate) AS TABLE "
                "SELECT unit, a.sample_index, a.sample_key, a.caption AS baseline_caption, "
                "b.caption AS candidate_caption, a.reference_captions, a.value AS baseline_value, "
                "b.value AS candidate_value FROM latest_samples a JOIN latest_samples b USING (unit, sample_index) "
                "WHERE a.experiment_id = baseline AND b.experiment_id = candidate AND a.caption IS NOT NULL "
                "AND b.caption IS NOT NULL ORDER BY unit, a.sample_index")
    # the rule that picks a leaderboard entry's run is dbt's latest_metrics mart, rendered over `metrics`
    create_view(con, "latest_metrics", columns=LEADERBOARD_COLUMNS)


def _any_gone(folder: AnyPath, problems: list[str]) -> bool:
    """Whether a problem (``<path>: why``) names a file that no longer exists: removed by a compaction, not
    damaged."""
    return not is_remote(folder) and any(not Path(p.split(": ", 1)[0]).exists() for p in problems)


def _new_compactions(root: AnyPath, listed: list[AnyPath]) -> bool:
    """A compacted file that the listing does not have: one published while the folders were being listed (a
    directory listing is no snapshot, so its sources may have been missed too)."""
    seen = {str(f) for f in listed}
    return any(str(f) not in seen for name in TABLES for f in (root / name).glob(f"{COMPACTED_PREFIX}*.parquet"))


def open_warehouse(output_dir: str | os.PathLike = "outputs", read_only: bool = False,
                   database: str = ":memory:") -> Warehouse:
    """The views over the files published now. Opening while `results compact` runs lists either the files before
    it or those after it: a listing that a compaction changed meanwhile is made again."""
    root = warehouse_dir(output_dir)
    for attempt in range(READ_ATTEMPTS):
        con = duckdb.connect(database)
        listed: list[AnyPath] = []
        try:
            return _open(con, root, read_only, listed)
        except FilesMoved:
            pass
        except (duckdb.Error, ResultsError):  # DuckDB binds each view to its files: one may be gone by then
            if not (any(not f.exists() for f in listed) or _new_compactions(root, listed)):
                raise
        con.close()
        time.sleep(0.005 * (attempt + 1))
    raise ResultsError(f"the result files under {root} kept changing while they were being read ({READ_ATTEMPTS} "
                       f"tries): is a `clipcache results compact` running in a loop?")


def _open(con: duckdb.DuckDBPyConnection, root: AnyPath, read_only: bool, listed: list[AnyPath]) -> Warehouse:
    if is_remote(root):  # DuckDB reads s3://, gs://, memory://... through the same fsspec filesystem we write with
        con.register_filesystem(root.fs)
    damaged = {name: _table_view(con, name, root / name, listed) for name in TABLES}
    if _new_compactions(root, listed) or any(not f.exists() for f in listed):
        raise FilesMoved(str(root))
    _derived_views(con)
    register_metadata_view(con, root)  # sample_metadata: per-sample group fields (storage/sample_metadata.py)
    if read_only:
        prefix = url(root).rstrip("/") + "/"
        con.execute(f"SET allowed_directories = ['{prefix.replace(chr(39), chr(39) * 2)}']")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    return Warehouse(con, {k: v for k, v in damaged.items() if v}, listed)


def read_consistently(output_dir: str | os.PathLike, read: Callable[[Warehouse], T], *,
                      read_only: bool = False) -> T:
    """``read(warehouse)``, started over on a fresh connection when it failed because `results compact` replaced
    files it was reading (DuckDB's IOException on a removed file, or anything else while a listed file is gone):
    every read sees the files before a compaction or those after it, never a traceback. ``read`` must fetch what
    it needs (it may run more than once; nothing it returns may read the connection later)."""
    for attempt in range(READ_ATTEMPTS):
        warehouse = open_warehouse(output_dir, read_only=read_only)
        try:
            return read(warehouse)
        except (duckdb.Error, ClipcacheError, OSError, pa.ArrowException):
            if not warehouse.moved():
                raise
        time.sleep(0.005 * (attempt + 1))
    raise ResultsError(f"the result files under {warehouse_dir(output_dir)} kept changing while they were being "
                       f"read ({READ_ATTEMPTS} tries): is a `clipcache results compact` running in a loop?")


def read_results(output_dir: str | os.PathLike, read: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """:func:`read_consistently` over :func:`connect`'s connection (a damaged result file is an error)."""
    def checked(warehouse: Warehouse) -> T:
        _raise_damaged(warehouse)
        return read(warehouse.con)

    return read_consistently(output_dir, checked)


def connect(output_dir: str | os.PathLike = "outputs", database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the views ``metrics``, ``metrics_all``, ``runs`` and ``leaderboard`` over the results
    under ``output_dir``. Raises ResultsError naming any result file that cannot be read."""
    warehouse = open_warehouse(output_dir, database=database)
    _raise_damaged(warehouse)
    return warehouse.con


def _raise_damaged(warehouse: Warehouse) -> None:
    problems = [p for lines in warehouse.damaged.values() for p in lines]
    if problems:
        raise ResultsError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                           + "; `clipcache results verify` lists every such file")


def sql_statements(sql: str) -> list[duckdb.Statement]:
    """The statements of ``sql``; ConfigError when there is none (empty, blank, only comments or ``;``)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise ResultsError(f"query failed: {str(e).splitlines()[0]}") from e
    if not statements:
        raise ConfigError("query: no SQL statement given")
    return statements


def check_read_only(sql: str) -> None:
    """Refuse anything but SELECT / EXPLAIN (no COPY, ATTACH, CREATE, SET, INSERT...)."""
    for statement in sql_statements(sql):
        kind = statement.type.name
        if kind not in ALLOWED_STATEMENTS:
            raise ResultsError(f"query: {kind} statements are not allowed; clipcache query only reads the results "
                               f"(pass --allow_writes to lift this)")


def check_export_path(out: str | os.PathLike, output_dir: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                      flag: str = "--out", folder: bool = False) -> Path:
    """``out`` as a path to write an export or a report to, or ConfigError: never a file inside the warehouse or the
    embedding cache (symlinks followed: an export written there would replace results or cache entries, or read as
    one), never a folder. With ``folder``, ``out`` is a folder the caller writes into: it must not be a file, and
    it must not hold the warehouse or the cache either. Besides the named ``output_dir`` and ``cache_dir``, any
    folder that has a cache's or a warehouse's layout is refused (storage/paths.py ``owning_store``): a command that
    was not told where the cache is still never writes into one. Every command's output path goes through here."""
    target = Path(out)
    resolved = target.resolve()
    shown = f"{target} (-> {resolved})" if resolved != target.absolute() else str(target)
    protected = [("the results warehouse", warehouse_dir(output_dir))]
    if cache_dir is not None:
        protected.append(("the embedding cache", as_path(cache_dir)))
    if (found := owning_store(resolved)) is not None:
        protected.append(found)
    for what, place in protected:
        if is_remote(place):
            continue  # a local file cannot land in a bucket
        place = Path(place).resolve()
        if resolved == place or resolved.is_relative_to(place):
            raise ConfigError(f"{flag}: {shown} is inside {what} ({place}); write it elsewhere, it would replace "
                              f"or add files there")
        if folder and place.is_relative_to(resolved):
            raise ConfigError(f"{flag}: {shown} holds {what} ({place}); name a folder of its own, it would be "
                              f"replaced as a whole")
    if folder:
        if resolved.exists() and not resolved.is_dir():
            raise ConfigError(f"{flag}: {shown} is a file; name a folder to write the pages into")
    elif resolved.is_dir():
        raise ConfigError(f"{flag}: {shown} is a folder; name a file to write")
    return target
