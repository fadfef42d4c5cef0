"""Hostile inputs to `clipcache query`, `results` and `report`: an export aimed at the results or the cache, a
foreign file posing as a compacted one, SQL that fails while its rows are produced, an empty statement, and Ctrl-C
during the dbt build. Each ends in one line and a known exit code, with every result file byte for byte as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clipcache.storage.experiment import Experiment
from clipcache.storage.results import new_run_id, warehouse_dir, write_metric_rows, write_run_row
from clipcache.storage.warehouse import open_warehouse

from hostile import Tree, assert_refused, run_cli

pytestmark = pytest.mark.hostile

CLI = Path(sys.executable).parent / "clipcache"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def write_results(out: Path) -> None:
    """Two completed runs of two models on one dataset, written the way a run writes them."""
    for model, value in (("model-a", 0.7), ("model-b", 0.6)):
        run_id = new_run_id()
        experiment = Experiment(model=model, checkpoint="tag:none", dataset="cls", split="test", language="en",
                                task="zeroshot_classification", sample_limit=None, default_prompts=True, prompts=None,
                                pretrained=None)
        row = {"run_id": run_id, "created_at": T0, **experiment.columns(), "model_fingerprint": "f", "metric": "acc",
               "k": 1, "value": value, "higher_is_better": True, "n_samples": 10, "cache_keys": ["a"],
               "clipcache_version": "0.2.0"}
        write_metric_rows(out, run_id, [row])
        write_run_row(out, {"run_id": run_id, "created_at": T0, "finished_at": T0, "status": "completed",
                            "kind": "evaluate", "config": {}, "versions": {}, "device": "cpu", "durations": {},
                            "clipcache_version": "0.2.0"})


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A results folder and, in the working folder, an embedding cache where `query`'s --cache_dir default finds
    it."""
    monkeypatch.chdir(tmp_path)
    write_results(tmp_path / "outputs")
    (tmp_path / "cache" / "embeddings").mkdir(parents=True)
    return tmp_path


def query(work: Path, sql: str, *flags: str) -> list[str]:
    return ["query", sql, "--output_dir", str(work / "outputs"), *flags]


def result_file(work: Path, table: str) -> Path:
    return sorted((warehouse_dir(work / "outputs") / table).glob("*.parquet"))[0]


TARGETS = {
    "a metrics file": lambda w: result_file(w, "metrics"),
    "a runs file": lambda w: result_file(w, "runs"),
    "a new file in the warehouse": lambda w: warehouse_dir(w / "outputs") / "metrics" / "export.parquet",
    "a link to the warehouse's folder": lambda w: _link(w / "exports", warehouse_dir(w / "outputs") / "metrics")
                                                  / "export.csv",
    "a link to a result file": lambda w: _link(w / "export.csv", result_file(w, "metrics")),
    "the cache folder": lambda w: Path("cache") / "embeddings" / "export.csv",
}


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("where", list(TARGETS))
def test_out_never_writes_into_the_results_or_the_cache(work, capsys, where, fmt):
    target = TARGETS[where](work)
    tree = Tree(work)
    code, _, err = run_cli(query(work, "SELECT * FROM metrics", "--format", fmt, "--out", str(target)), capsys)
    assert_refused(code, err, "--out: ")
    assert code == 2 and ("results warehouse" in err or "embedding cache" in err), err
    assert tree.changes() == (set(), set(), set())  # nothing replaced, nothing added anywhere


def test_out_in_a_cache_folder_given_by_flag(work, capsys):
    other = work / "elsewhere" / "cache"
    other.mkdir(parents=True)
    tree = Tree(work)
    code, _, err = run_cli(query(work, "SELECT 1", "--out", str(other / "x.csv"), "--cache_dir", str(other)),
                           capsys)
    assert_refused(code, err, "is inside the embedding cache")
    tree.assert_unchanged(work)


def test_out_naming_a_folder_is_one_line(work, capsys):
    (work / "exports").mkdir()
    tree = Tree(work)
    code, _, err = run_cli(query(work, "SELECT 1", "--format", "csv", "--out", str(work / "exports")), capsys)
    assert_refused(code, err, "is a folder")
    assert code == 2
    tree.assert_unchanged(work)


def test_report_out_never_writes_into_the_results(work, capsys):
    tree = Tree(work)
    code, _, err = run_cli(["report", "--output_dir", str(work / "outputs"), "--out",
                            str(result_file(work, "metrics"))], capsys)
    assert_refused(code, err, "is inside the results warehouse")
    tree.assert_unchanged(work)


@pytest.mark.parametrize("content", ["foreign", "not parquet", "a metrics file naming another's file"])
def test_a_foreign_compacted_file_is_checked_like_any_other(work, capsys, content):
    """A file named compacted-*.parquet decides which files the views hide; one that is not a metrics file must be a
    problem of its own, not a traceback, and must hide nothing."""
    bad = warehouse_dir(work / "outputs") / "metrics" / "compacted-x.parquet"
    if content == "foreign":
        pq.write_table(pa.table({"source_file": [result_file(work, "metrics").name], "a": [1]}), bad)
    elif content.startswith("a metrics file"):  # right columns and row count, other rows: would hide the real ones
        real, other = sorted((warehouse_dir(work / "outputs") / "metrics").glob("*.parquet"))
        rows = pq.read_table(other)
        pq.write_table(rows.set_column(rows.schema.get_field_index("source_file"), "source_file",
                                       pa.array([real.name] * len(rows), pa.string())), bad)
    else:
        bad.write_bytes(b"PAR1 this is not a parquet file")
    tree = Tree(work)

    code, out, err = run_cli(["results", "verify", "--output_dir", str(work / "outputs")], capsys)
    assert code == 1 and err == "", err
    problems = [line for line in out.splitlines() if line.startswith("problem ")]
    assert len(problems) == 1 and "compacted-x.parquet" in problems[0] and "Traceback" not in out, out

    code, _, err = run_cli(query(work, "SELECT count(*) FROM metrics"), capsys)
    assert_refused(code, err, "compacted-x.parquet")
    assert code == 1
    for argv in (["results", "compact", "--output_dir", str(work / "outputs")],
                 ["report", "--output_dir", str(work / "outputs")]):
        code, _, err = run_cli(argv, capsys)
        assert_refused(code, err, "compacted-x.parquet")
    tree.assert_unchanged(work)

    # left out of the views, and hiding nothing: the file it names as absorbed is still read
    warehouse = open_warehouse(work / "outputs")
    assert [p.split(":")[0] for p in warehouse.damaged["metrics"]] == [str(bad)]
    assert warehouse.con.sql("SELECT count(*) FROM metrics").fetchall() == [(2,)]


@pytest.mark.parametrize("sql", ["SELECT CAST(model AS INTEGER) FROM metrics", "SELECT error('x')"],
                         ids=["cast", "error()"])
@pytest.mark.parametrize("fmt", [None, "table", "csv", "json", "parquet"])
def test_sql_failing_while_rows_are_fetched_is_one_line_and_writes_nothing(work, capsys, sql, fmt):
    target = work / f"export.{fmt}"
    flags = [] if fmt is None else ["--format", fmt, "--out", str(target)]
    tree = Tree(work)
    code, _, err = run_cli(query(work, sql, *flags), capsys)
    assert_refused(code, err, "query failed: ")
    assert code == 1
    assert tree.changes() == (set(), set(), set())


@pytest.mark.parametrize("fmt", ["csv", "json", "table", "parquet"])
def test_a_failed_query_leaves_an_earlier_export_whole(work, capsys, fmt):
    target = work / f"export.{fmt}"
    assert run_cli(query(work, "SELECT model, value FROM metrics", "--format", fmt, "--out", str(target)),
                   capsys)[0] == 0
    tree = Tree(work)
    code, _, err = run_cli(query(work, "SELECT error('late')", "--format", fmt, "--out", str(target)), capsys)
    assert_refused(code, err, "query failed: ")
    tree.assert_unchanged(work)


@pytest.mark.parametrize("sql", ["", "   \n", ";", "-- nothing here", "/* nor here */ ;"])
def test_no_sql_statement_is_a_config_error(work, capsys, sql):
    code, out, err = run_cli(query(work, sql), capsys)
    assert_refused(code, err, "query: no SQL statement given")
    assert code == 2 and out == ""


def report_here(work: Path) -> int:
    """`clipcache report` in this process (dbt runs in the CLI's process either way), with no server configured:
    the report runs locally. Only the interrupted report below needs a process of its own, for its signal."""
    from clipcache.flows.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        patch.delenv("PREFECT_API_URL", raising=False)
        patch.setenv("PREFECT_HOME", str(work / "prefect"))
        return main(["report", "--output_dir", str(work / "outputs")])


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """Results and a finished report of them (the files an interrupted report must leave as they are)."""
    work = tmp_path_factory.mktemp("report")
    write_results(work / "outputs")
    assert report_here(work) == 0
    return work


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_URL")}
    return {**env, "PREFECT_HOME": str(work / "prefect")}  # no server configured: the report runs locally


@pytest.mark.slow
def test_ctrl_c_during_dbt_is_exit_130_in_one_line_and_keeps_the_last_report(reported):
    outputs = reported / "outputs"
    report = outputs / "report"
    log = report / "dbt_logs" / "dbt.log"
    log.unlink()
    tree = Tree(reported)
    proc = subprocess.Popen([str(CLI), "report", "--output_dir", str(outputs)], cwd=reported, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(reported))
    try:
        deadline = time.monotonic() + 120
        # dbt's own log says when it runs the models, which write the marts database
        while "Began running node" not in (log.read_text(errors="replace") if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "dbt never started running models"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1 and "interrupted" in err, (out, err)
    assert out.strip() == ""
    # the last report and its marts are whole and untouched; the build left no staging files
    tree.assert_unchanged(warehouse_dir(outputs), report / "index.html", report / "reports.duckdb")
    assert not (report / ".dbt-build").exists()
    # and the next report builds (dbt's own files survived the interrupt)
    assert report_here(reported) == 0
    import duckdb

    con = duckdb.connect(str(report / "reports.duckdb"), read_only=True)
    assert con.sql("select count(*) from leaderboard").fetchall() == [(2,)]
    con.close()
