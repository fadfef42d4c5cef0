"""``clipcache query "SELECT ..."``: SQL over the results (views ``metrics`` and ``runs``)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from datetime import date, datetime
from decimal import Decimal
from typing import Any


def add_query_parser(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser("query", help="run SQL over the results (views: metrics, runs)",
                       description="DuckDB SQL over the Parquet results under --output_dir. Views: metrics (one row "
                                   "per metric value), runs (one row per run).")
    q.add_argument("sql")
    q.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    q.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    q.add_argument("--out", default=None, help="write to this file instead of standard output (required for parquet)")
    q.set_defaults(handler=run_query)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def run_query(args: argparse.Namespace) -> int:
    import duckdb

    from clipcache.storage.errors import ConfigError, ResultsError
    from clipcache.storage.warehouse import connect

    con = connect(args.output_dir)
    try:
        relation = con.sql(args.sql)
    except duckdb.Error as e:
        raise ResultsError(f"query failed: {e}") from e
    if relation is None:
        return 0  # a statement without a result (e.g. SET)
    if args.format == "parquet":
        if not args.out:
            raise ConfigError("--format parquet needs --out FILE")
        relation.write_parquet(args.out)
        return 0
    columns, rows = relation.columns, relation.fetchall()
    stream = open(args.out, "w", newline="", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    try:
        if args.format == "csv":
            writer = csv.writer(stream)
            writer.writerow(columns)
            writer.writerows(rows)
        elif args.format == "json":
            json.dump([{c: _jsonable(v) for c, v in zip(columns, row, strict=True)} for row in rows], stream,
                      indent=1)
            stream.write("\n")
        else:
            from rich.console import Console
            from rich.table import Table

            table = Table()
            for column in columns:
                table.add_column(column)
            for row in rows:
                table.add_row(*("" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v) for v in row))
            Console(file=stream, width=None if stream.isatty() else 160).print(table)
    finally:
        if args.out:
            stream.close()
    return 0


def add_results_parser(sub: argparse._SubParsersAction) -> None:
    results = sub.add_parser("results", help="maintain the Parquet results")
    results.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    actions = results.add_subparsers(dest="action", required=True)
    actions.add_parser("compact", help="merge small result files (row count and checksum are checked to be equal)")
    results.set_defaults(handler=run_results)


def run_results(args: argparse.Namespace) -> int:
    from rich.console import Console

    from clipcache.storage.compaction import TABLES, compact
    from clipcache.storage.errors import ResultsError

    out = Console()
    for table in TABLES:
        r = compact(args.output_dir, table)
        if (r.rows_before, r.checksum_before) != (r.rows_after, r.checksum_after):
            raise ResultsError(f"compaction of {table} changed the data: {r.rows_before} rows / {r.checksum_before} "
                               f"before, {r.rows_after} / {r.checksum_after} after")
        out.print(f"{table}: {r.files_before} files -> {r.files_after}, {r.rows_after:,} rows, checksum "
                  f"{r.checksum_after} (unchanged)", highlight=False)
    return 0


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="build the dbt marts and write a static HTML report")
    r.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    r.add_argument("--out", default=None, help="HTML file (default: <output_dir>/report/index.html)")
    r.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from clipcache.flows.params import validate
    from clipcache.flows.report import ReportParams, report

    path = report(validate(ReportParams, {"output_dir": args.output_dir, "report_path": args.out}))
    Console().print(f"report: {path}", highlight=False)
    return 0
