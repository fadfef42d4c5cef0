"""Run the dbt_reports project (dbt-duckdb) over an output directory's Parquet results.

The marts database is built beside the published one and renamed over it once dbt has finished and closed it, so a
failed or interrupted build leaves the previous report's database as it was (dbt itself rebuilds tables in place).
dbt runs in this process; Ctrl-C during it ends as Ctrl-C anywhere else (KeyboardInterrupt, exit 130), not as a
failed build: dbt catches the interrupt itself and returns it as its result.

The dbt project (models, macros, tests) ships inside the package (``clipcache/dbt_reports``, the repository's
dbt_reports/ folder) and is only read: its profile, dbt's target/ and logs are written under the report folder, so an
installed, read-only site-packages works.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from clipcache.storage.errors import ResultsError
from clipcache.storage.paths import lock

# clipcache/tasks/report/ -> clipcache/dbt_reports in an installed package; resolved, the repository's dbt_reports/
PROJECT_DIR = Path(__file__).resolve().parents[2] / "dbt_reports"
PROFILE = "clipcache_reports"
DATABASE = "reports.duckdb"
# The database is built here and renamed into the report folder. A fixed path, not a random one: dbt's partial
# parsing starts over whenever the connection settings (the database path among them) change, and the file name
# must stay reports.duckdb, the catalog name the staging views refer to.
BUILD_DIR = ".dbt-build"


def check_results(output_dir: str | Path) -> None:
    """Every result file dbt will read is one of ours, in the current schema (dbt reads every file in the folder,
    those a compacted file absorbed too)."""
    from clipcache.storage.results import TABLES, file_problem, schema_versions, warehouse_dir

    for table in TABLES:
        folder = warehouse_dir(output_dir) / table
        files = sorted(folder.glob("*.parquet")) if folder.exists() else []
        for f in files:
            problem = file_problem(f, table)
            if problem:
                raise ResultsError(f"{problem}; move it out of the warehouse first (`clipcache results verify` "
                                   f"lists every such file)")
        old = [f for f in files if schema_versions(f) != {2}]
        if old:
            raise ResultsError(f"{old[0]} was written by an older clipcache: run `clipcache results migrate "
                               f"--output_dir {output_dir}` first")


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _noting_sigint() -> Iterator[threading.Event]:
    """An event set when SIGINT arrives (which still raises KeyboardInterrupt as before): dbt catches the
    KeyboardInterrupt and may report it as a failed node, so the event is what says the user interrupted."""
    interrupted = threading.Event()
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield interrupted  # signals reach only the main thread; and an ignored SIGINT stays ignored
        return

    handler: Callable[[int, FrameType | None], Any] = previous

    def note(signum: int, frame: FrameType | None) -> None:
        interrupted.set()
        handler(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _close_dbt_database() -> None:
    """dbt-duckdb keeps its DuckDB database open after a run (profile setting keep_open, on by default) and writes
    the rest of it at close: close it, so the file is complete and nothing writes to it once renamed."""
    from dbt.adapters.duckdb.connections import DuckDBConnectionManager

    DuckDBConnectionManager.close_all_connections()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def dbt_build(output_dir: str | Path, work_dir: str | Path | None = None, *, unit_tests: bool = False) -> Path:
    """``dbt build`` (models + data tests) into ``<output_dir>/report/reports.duckdb``, plus the suites' intervals and
    ranks (tasks/report/suites.py); returns it.

    ``unit_tests``: also run the project's dbt unit tests. They check the models' SQL on fixed rows written in
    dbt_reports/models/schema.yml, never the warehouse, so a report would repeat the same check every time: as
    dbt recommends, they run where the SQL changes (the test suite: tests/test_group_marts.py), not in every
    `clipcache report`."""
    check_results(output_dir)  # before dbt's import (seconds): a foreign file is refused at once
    output_dir = Path(output_dir).resolve()
    work = Path(work_dir).resolve() if work_dir else output_dir / "report"
    building = work / BUILD_DIR
    staged, database = building / DATABASE, work / DATABASE
    env = {"DBT_SEND_ANONYMOUS_USAGE_STATS": "False",  # its only network call
           "CLIPCACHE_WAREHOUSE": str(output_dir / "warehouse"), "CLIPCACHE_DBT_DATABASE": str(staged)}
    # One build at a time per report folder: they share the staging folder and dbt's target and log folders.
    with lock(work / f"{BUILD_DIR}.lock"):
        shutil.rmtree(building, ignore_errors=True)  # what a build killed before its end left
        building.mkdir(parents=True)
        _build(env, work, staged, database, output_dir, unit_tests=unit_tests)
    return database


def write_profile(folder: Path) -> Path:
    """dbt's profiles.yml for this build, in ``folder`` (under the report folder; never in the package): DuckDB at
    the staged database, one thread. Returns the folder, for --profiles-dir."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    profile = {PROFILE: {"target": "local", "outputs": {"local": {
        "type": "duckdb", "path": "{{ env_var('CLIPCACHE_DBT_DATABASE') }}", "threads": 1}}}}
    (folder / "profiles.yml").write_text(yaml.safe_dump(profile, sort_keys=False), encoding="utf-8")
    return folder


def _build(env: dict[str, str], work: Path, staged: Path, database: Path, output_dir: Path, *,
           unit_tests: bool) -> None:
    from dbt.cli.main import dbtRunner

    from clipcache.tasks.evaluation import dbt_vars
    from clipcache.tasks.report.suites import suite_vars, write_suite_intervals

    try:
        with _environment(env), _noting_sigint() as interrupted:
            try:
                # --log-level none: dbt's console output (its own tracebacks included) goes to its log file only;
                # a failure is reported below in one line that names the log.
                result = dbtRunner().invoke([
                    "build", "--project-dir", str(PROJECT_DIR), "--profiles-dir", str(write_profile(staged.parent)),
                    "--target-path", str(work / "dbt_target"), "--log-path", str(work / "dbt_logs"),
                    "--vars", json.dumps({**dbt_vars(), **suite_vars()}), "--log-level", "none",
                    "--log-level-file", "debug", *([] if unit_tests else ["--exclude-resource-type", "unit_test"])])
            finally:
                _close_dbt_database()
        if interrupted.is_set() or isinstance(result.exception, KeyboardInterrupt):
            raise KeyboardInterrupt
        if not result.success:
            failures = []
            for r in getattr(result.result, "results", None) or []:
                if str(r.status) not in ("success", "pass"):
                    failures.append(f"{r.node.name}: {r.status} {r.message or ''}".strip())
            detail = _one_line("; ".join(failures) or str(result.exception))
            raise ResultsError(f"dbt build failed ({detail}); logs in {work / 'dbt_logs'}")
        # the suites' intervals and ranks (a bootstrap over sample rows, not SQL) beside the marts, before publishing
        write_suite_intervals(staged, output_dir)
        # A WAL beside the published file belongs to the old database (its writer died): it must not be replayed
        # into the new one.
        database.with_name(DATABASE + ".wal").unlink(missing_ok=True)
        os.replace(staged, database)
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)
