"""``clipcache query "SELECT ..."``: SQL over the results (views ``metrics`` and ``runs``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

from clipcache.flows.cli.commands import add_command


def check_output_dir(output_dir: str) -> None:
    """A mistyped --output_dir is an error, not an empty answer."""
    from clipcache.storage.errors import ConfigError
    from clipcache.storage.results import warehouse_dir

    if not warehouse_dir(output_dir).exists():
        raise ConfigError(f"output_dir: {output_dir} has no results (no {warehouse_dir(output_dir)}): is it the "
                          f"--output_dir the evaluations wrote to?")


def add_query_parser(sub: argparse._SubParsersAction) -> None:
    q = add_command(sub, "query",
                    description="DuckDB SQL over the Parquet results under --output_dir. Views: leaderboard (the "
                                "latest complete reference value per model, checkpoint, dataset, split, language, "
                                "task, precision, metric, k), metrics (one row per metric value of completed runs, "
                                "limited runs and what-ifs included), metrics_all (every row and its run's "
                                "status), runs (one row per run). Read-only: SELECT only, no file access.")
    q.add_argument("sql")
    q.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    q.add_argument("--allow_writes", "--allow-writes", dest="allow_writes", action="store_true",
                   help="lift the read-only guard (any statement, any file)")
    q.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    q.add_argument("--out", default=None, help="write to this file instead of standard output (required for "
                                               "parquet); written whole or not at all, never inside the warehouse "
                                               "or the cache folder")
    q.add_argument("--cache_dir", "--cache-dir", dest="cache_dir", default="cache",
                   help="the embedding cache, which --out may not write into (default: cache)")
    q.set_defaults(handler=run_query)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _render(columns: list[str], rows: list[tuple], fmt: str, stream: TextIO) -> None:
    if fmt == "csv":
        from clipcache.storage.spreadsheet import csv_writer

        writer = csv_writer(stream)
        writer.writerow(columns)
        writer.writerows(rows)
    elif fmt == "json":
        # default=str: UUIDs, intervals, blobs... print as DuckDB spells them rather than stop the export
        json.dump([{c: _jsonable(v) for c, v in zip(columns, row, strict=True)} for row in rows], stream, indent=1,
                  default=str)
        stream.write("\n")
    else:
        from rich.table import Table

        from clipcache.flows.cli.console import data_console

        table = Table()
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*("" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v) for v in row))
        data_console(160, file=stream).print(table)


def run_query(args: argparse.Namespace) -> int:
    import duckdb

    from clipcache.storage.atomic import atomic_write
    from clipcache.storage.errors import ConfigError, ResultsError
    from clipcache.storage.warehouse import check_export_path, check_read_only, read_consistently, sql_statements

    check_output_dir(args.output_dir)
    sql_statements(args.sql)
    if not args.allow_writes:
        check_read_only(args.sql)
    if args.format == "parquet" and not args.out:
        raise ConfigError("--format parquet needs --out FILE")
    out = check_export_path(args.out, args.output_dir, cache_dir=args.cache_dir) if args.out else None
    if out is not None and not out.parent.is_dir():
        raise ConfigError(f"--out: folder {out.parent} does not exist")
    from clipcache.tasks.suites.sql import register

    def read(warehouse: Any) -> tuple[Any, Any, Any]:
        """(arrow table or None, columns, rows), all fetched (from the files before or after a concurrent
        `results compact`: storage/warehouse.py starts a read over when they were replaced)."""
        register(warehouse.con)  # suite_datasets, suite_results, suite_scores
        problems = warehouse.problems_for(args.sql)
        if problems:
            raise ResultsError(f"{problems[0]}; move it out of the warehouse (`clipcache results verify` lists "
                               f"every such file)")
        # Every row is fetched before anything is written: DuckDB reports most errors (a failed cast, error())
        # only while it produces rows, and a failed query must leave no file, not half of one.
        try:
            relation = warehouse.con.sql(args.sql)
            if relation is None:
                return None, None, None  # a statement without a result (e.g. SET)
            if args.format == "parquet":
                return relation.to_arrow_table(), None, None  # written by us: the query itself may not touch files
            return None, relation.columns, relation.fetchall()
        except duckdb.Error as e:
            raise ResultsError(f"query failed: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from e

    table, columns, rows = read_consistently(args.output_dir, read, read_only=not args.allow_writes)
    if table is None and columns is None:
        return 0
    if out is None:
        _render(columns, rows, args.format, sys.stdout)
    elif args.format == "parquet":
        import pyarrow.parquet as pq

        atomic_write(out, lambda tmp: pq.write_table(table, tmp))
    else:
        atomic_write(out, lambda tmp: _render_file(columns, rows, args.format, tmp))
    return 0


def _render_file(columns: list[str], rows: list[tuple], fmt: str, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as stream:
        _render(columns, rows, fmt, stream)


def add_results_parser(sub: argparse._SubParsersAction) -> None:
    results = add_command(sub, "results")
    _output_dir(results)
    actions = results.add_subparsers(dest="action", required=True)
    for name, text in (("compact", "merge small result files (row count and checksum are checked to be equal)"),
                       ("migrate", "rewrite result files of older releases in the current schema (nothing is lost)"),
                       ("verify", "list unreadable or foreign files, and rows of runs that did not complete")):
        _output_dir(actions.add_parser(name, help=text))
    results.set_defaults(handler=run_results)


def _output_dir(parser: argparse.ArgumentParser) -> None:
    """Accepted before and after the action (`results --output_dir X compact` and `results compact --output_dir X`)."""
    parser.add_argument("--output_dir", "--output-dir", dest="output_dir", default=argparse.SUPPRESS)


def run_results(args: argparse.Namespace) -> int:
    from clipcache.flows.cli.console import data_console, styled
    from clipcache.storage.compaction import compact
    from clipcache.storage.errors import ResultsError
    from clipcache.storage.results import TABLES

    args.output_dir = getattr(args, "output_dir", "outputs")
    check_output_dir(args.output_dir)
    out = data_console()
    if args.action == "verify":
        from clipcache.storage.result_checks import verify_results

        problems, notes = verify_results(args.output_dir)
        for line in problems:
            out.print(styled("problem", "red", line), highlight=False, soft_wrap=True)
        for line in notes:
            out.print(styled("note", "yellow", line), highlight=False, soft_wrap=True)
        out.print(f"verified the results under {args.output_dir}: {len(problems)} problem(s), {len(notes)} note(s)")
        return 1 if problems else 0
    if args.action == "migrate":
        from clipcache.flows.migrations.results import migrate

        for line in migrate(args.output_dir):
            out.print(line, highlight=False)
        return 0
    for table in TABLES:
        r = compact(args.output_dir, table)
        if (r.rows_before, r.checksum_before) != (r.rows_after, r.checksum_after):
            raise ResultsError(f"compaction of {table} changed the data: {r.rows_before} rows / {r.checksum_before} "
                               f"before, {r.rows_after} / {r.checksum_after} after")
        out.print(f"{table}: {r.files_before} files -> {r.files_after}, {r.rows_after:,} rows, checksum "
                  f"{r.checksum_after} (unchanged)", highlight=False)
    return 0


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    r = add_command(sub, "report")
    r.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    r.add_argument("--out", default=None, help="HTML file (default: <output_dir>/report/index.html); with --compare "
                                               "a folder (default: <output_dir>/report/compare/<A>-vs-<B>)")
    r.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="two experiment ids (or unique prefixes), models or model@checkpoint, as `clipcache compare` "
                        "takes them: per dataset they share, the samples that flipped each way, with thumbnails")
    r.add_argument("--max_flips", "--max-flips", dest="max_flips", type=int, default=50,
                   help="with --compare: flips listed each way per dataset (all are counted; default 50)")
    r.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from clipcache.flows.config.params import validate
    from clipcache.flows.orchestration.launch import report
    from clipcache.flows.orchestration.reporting import ReportParams
    from clipcache.storage.warehouse import check_export_path
    from clipcache.tasks.report.compare_report import check_compare_folder

    if args.out:  # named by its flag here; ReportParams checks the same for deployments and Python calls
        if args.compare:
            check_compare_folder(args.out, args.output_dir)
        else:
            check_export_path(args.out, args.output_dir)
    params = validate(ReportParams, {"output_dir": args.output_dir, "report_path": args.out,
                                     "compare": args.compare, "max_flips": args.max_flips})
    check_output_dir(args.output_dir)
    path = report(params)
    Console().print(f"report: {path}", highlight=False, soft_wrap=True, markup=False)
    return 0
