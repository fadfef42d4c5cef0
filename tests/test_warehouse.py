"""Results warehouse: SQL views, query CLI, append-only atomic writes, compaction, real dbt build, HTML report in a
real headless browser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from clipcache.flows.cli import main
from clipcache.storage.compaction import compact, table_checksum
from clipcache.storage.experiment import Experiment
from clipcache.storage.results import new_run_id, warehouse_dir, write_metric_rows, write_run_row
from clipcache.storage.warehouse import connect

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def metric_row(run_id, created_at, model="m", dataset="d", task="zeroshot_classification", metric="acc", k=1,
               value=0.5, higher=True, pretrained=None, limit=None, default_prompts=True, language="en"):
    experiment = Experiment(model=model, checkpoint=f"tag:{pretrained or 'none'}", dataset=dataset, split="test",
                            language=language, task=task, sample_limit=limit, default_prompts=default_prompts,
                            prompts=None if default_prompts else "ab" * 32, pretrained=pretrained)
    return {"run_id": run_id, "created_at": created_at, **experiment.columns(), "model_fingerprint": "f",
            "metric": metric, "k": k, "value": value, "higher_is_better": higher, "n_samples": 10,
            "cache_keys": ["a", "b"], "clipcache_version": "0.2.0"}


def write_run(out, when, rows, status="completed"):
    run_id = new_run_id()
    write_metric_rows(out, run_id, [metric_row(run_id, when, **r) for r in rows])
    write_run_row(out, {"run_id": run_id, "created_at": when, "finished_at": when, "status": status,
                        "kind": "evaluate", "config": {"x": 1}, "versions": {}, "device": "cpu", "durations": {},
                        "clipcache_version": "0.2.0"})
    return run_id


def add_everything_else(out):
    """What a real warehouse also holds: a second checkpoint, a limited smoke run, a what-if, text retrieval rows,
    a run in another language and a failed run; none of the extra runs may change the leaderboard's values of the
    first checkpoint in English."""
    late = T0 + timedelta(days=3)
    write_run(out, late, [{"model": "model-a", "pretrained": "epoch_32.pt@0f0f0f0f", "dataset": "cls",
                           "value": 0.5}])
    write_run(out, late, [{"model": "model-a", "dataset": "cls", "value": 0.99, "limit": 100}])
    write_run(out, late, [{"model": "model-a", "dataset": "cls", "value": 0.98, "default_prompts": False}])
    write_run(out, late, [{"model": "minilm", "dataset": "beir", "task": "text_retrieval", "metric": "ndcg", "k": 10,
                           "value": 0.42}])
    write_run(out, late, [{"model": "model-a", "dataset": "cls", "value": 0.33, "language": "cn"}])
    write_run(out, late, [{"model": "model-a", "dataset": "cls", "task": "linear_probe", "metric": "lp_acc",
                           "value": 0.88}])
    write_run(out, late, [{"model": "model-a", "dataset": "cls", "value": 0.97}], status="failed")


@pytest.fixture
def history(tmp_path):
    """Two models, a classification and a retrieval dataset, two nights; model b regresses on night 2."""
    out = tmp_path / "outputs"
    for night, (a_acc, b_acc) in enumerate([(0.70, 0.80), (0.72, 0.60)]):
        when = T0 + timedelta(days=night)
        for model, acc in (("model-a", a_acc), ("model-b", b_acc)):
            write_run(out, when, [
                {"model": model, "dataset": "cls", "metric": "acc", "k": 1, "value": acc},
                {"model": model, "dataset": "cls", "metric": "acc", "k": 5, "value": min(1.0, acc + 0.2)},
                *[{"model": model, "dataset": "ret", "task": "zeroshot_retrieval", "metric": f"{d}_retrieval_recall",
                   "k": k, "value": min(1.0, acc * (1 + k / 10))} for d in ("image", "text") for k in (1, 5, 10)],
            ])
    return out


def test_views_and_empty_warehouse(history, tmp_path):
    con = connect(history)
    assert con.sql("select count(*) from metrics").fetchall() == [(4 * 8,)]
    assert con.sql("select count(*), min(status) from runs").fetchall() == [(4, "completed")]
    assert "source_file" not in con.sql("select * from metrics").columns
    assert connect(tmp_path / "nothing").sql("select count(*) from metrics").fetchall() == [(0,)]


def test_query_cli_formats(history, tmp_path, capsys):
    sql = "select model, value from metrics where metric = 'acc' and k = 1 order by created_at, model"
    assert main(["query", sql, "--output_dir", str(history), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == {"model": "model-a", "value": 0.7} and len(rows) == 4
    assert main(["query", sql, "--output_dir", str(history), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["model,value", "model-a,0.7"]
    target = tmp_path / "q.parquet"
    assert main(["query", sql, "--output_dir", str(history), "--format", "parquet", "--out", str(target)]) == 0
    assert pq.read_table(target).num_rows == 4
    assert main(["query", "select nope from metrics", "--output_dir", str(history)]) == 1
    assert "query failed" in capsys.readouterr().err


@pytest.mark.parametrize("sql", [
    "COPY (SELECT * FROM metrics) TO '{tmp}/leak.csv'",
    "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "ATTACH '{tmp}/new.duckdb' AS x",
    "CREATE TABLE t AS SELECT 1",
    "DROP VIEW metrics",
    "SET enable_external_access = true",
    "SELECT 1; COPY (SELECT 1) TO '{tmp}/two.csv'",
    "INSTALL httpfs",
])
def test_query_only_reads_the_results(history, tmp_path, capsys, sql):
    sql = sql.format(tmp=tmp_path)
    assert main(["query", sql, "--output_dir", str(history)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]  # nothing was written anywhere
    # the views still answer after the refused statement
    assert main(["query", "select count(*) as n from runs", "--output_dir", str(history), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 4}]


def test_query_writes_files_only_when_asked(history, tmp_path, capsys):
    target = tmp_path / "export.csv"
    sql = f"COPY (SELECT model, value FROM leaderboard) TO '{target}'"
    assert main(["query", sql, "--output_dir", str(history), "--allow_writes"]) == 0
    assert target.read_text().startswith("model,value")


def test_python_connect(history):
    import clipcache

    assert clipcache.connect(str(history)).sql("select count(distinct model) from metrics").fetchall() == [(2,)]


def test_a_crashed_write_leaves_nothing_visible(history):
    folder = warehouse_dir(history) / "metrics"
    (folder / ".run.parquet.abc.tmp").write_bytes(b"PAR1 half a file")  # what a crash mid-write leaves
    assert connect(history).sql("select count(*) from metrics").fetchall() == [(32,)]


def test_compaction_keeps_every_row_and_runs_beside_concurrent_writers(history):
    before = table_checksum(history, "metrics")
    stop = threading.Event()
    written = []

    def writer():
        while not stop.is_set():
            written.append(write_run(history, T0 + timedelta(days=5), [{"model": "late", "value": 0.1}]))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(written) < 4:  # compact while the writer is busy, with its first files already there
            time.sleep(0.01)
        report = compact(history, "metrics")
    finally:
        stop.set()
        thread.join()
    assert report.files_before >= 8 and report.rows_before >= before[0]
    con = connect(history)
    assert con.sql("select count(*) from metrics").fetchall() == [(32 + len(written),)]
    assert con.sql("select count(*) from metrics where model = 'late'").fetchall() == [(len(written),)]
    again = compact(history, "metrics")
    assert again.files_after == 1 and (again.rows_before, again.checksum_before) == (again.rows_after,
                                                                                     again.checksum_after)


def test_interrupted_compaction_hides_leftovers(history, tmp_path, capsys):
    folder = warehouse_dir(history) / "metrics"
    backup = tmp_path / "backup"
    shutil.copytree(folder, backup)
    before = table_checksum(history, "metrics")
    compact(history, "metrics")
    for f in backup.glob("*.parquet"):  # as if deleting the sources had been interrupted
        shutil.copy(f, folder)
    assert table_checksum(history, "metrics") == before
    assert main(["results", "--output_dir", str(history), "compact"]) == 0
    assert "(unchanged)" in capsys.readouterr().out
    assert len(list(folder.glob("*.parquet"))) == 1


@pytest.mark.slow
def test_dbt_build_and_report_in_a_real_browser(history, tmp_path):
    from clipcache.flows.orchestration.launch import report
    from clipcache.flows.orchestration.reporting import ReportParams

    add_everything_else(history)
    with_compaction = compact(history, "metrics")  # the marts must read compacted warehouses too
    assert with_compaction.files_after == 1
    html_path = Path(report(ReportParams(output_dir=str(history))))
    page = html_path.read_text()
    assert "model-b" in page and "regressed" in page and "<svg" in page and "epoch_32.pt@0f0f0f0f" in page
    import duckdb

    con = duckdb.connect(str(history / "report" / "reports.duckdb"))
    board = {(m, p, d): v for m, p, d, v in
             con.sql("select model, pretrained, dataset, main_value from leaderboard where language = 'en' "
                     "and task <> 'linear_probe'").fetchall()}
    # another language is its own row and its own column in the report, never mixed into the English one
    assert con.sql("select dataset_label, main_value from leaderboard where language = 'cn'").fetchall() == \
        [("cls [cn]", pytest.approx(0.33))]
    assert "cls [cn]" in page
    # a probe on the same dataset is a column of its own, and its own macro average: never mixed with zero-shot
    assert "cls · linear_probe" in page and "cls · zeroshot_classification" in page
    assert con.sql("select macro_average from model_summary where model = 'model-a' and pretrained is null "
                   "and task = 'linear_probe'").fetchall() == [(pytest.approx(0.88),)]
    assert board[("model-b", None, "cls")] == pytest.approx(0.60)  # the latest night, not the better first one
    # the limited run, the what-if and the failed run never become the value; the other checkpoint is its own row
    assert board[("model-a", None, "cls")] == pytest.approx(0.72)
    assert board[("model-a", "epoch_32.pt@0f0f0f0f", "cls")] == pytest.approx(0.5)
    assert board[("minilm", None, "beir")] == pytest.approx(0.42)
    # the same rule as the warehouse's own leaderboard view
    view = {(m, p, d): v for m, p, d, v in connect(history).sql(
        "select model, pretrained, dataset, value from leaderboard where metric = 'acc' and k = 1 "
        "and language = 'en'").fetchall()}
    assert view == {k: v for k, v in board.items() if k[2] == "cls"}
    assert con.sql("select count(*) from metric_history where regressed and model = 'model-b' and metric = 'acc' "
                   "and k = 1").fetchall() == [(1,)]
    con.close()

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (.ci/run does)")
        pytest.skip("chromium is not installed here (apt-get install chromium)")
    shot = tmp_path / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    # wait for the page to finish loading and painting: on a busy machine a screenshot taken at once
                    # once missed the curves' line
                    "--virtual-time-budget=5000",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,4000",
                    html_path.as_uri()], check=True, capture_output=True, timeout=120)
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 4000)  # tall enough for the curves below the tables, whatever the history holds
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, tables, heatmap, curves: not a blank page
    # The heatmap's blue cells and the curves' orange line are on the page.
    import numpy as np

    px = np.asarray(img).reshape(-1, 3).astype(int)
    r, g, b = px[:, 0], px[:, 1], px[:, 2]
    assert ((b > 150) & (r < 120)).any() and ((r > 230) & (g > 110) & (g < 150) & (b < 60)).any()


def test_a_fresh_process_reads_a_compacted_warehouse(history):
    """Reading compacted files uses pyarrow.compute, which ``import pyarrow`` alone does not load: a new process
    (nothing else imported) must still answer after ``results compact``."""
    compact(history, "metrics")
    code = "import sys; from clipcache import connect; print(connect(sys.argv[1]).sql('select count(*) from metrics'" \
           ").fetchall())"
    done = subprocess.run([sys.executable, "-c", code, str(history)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[(32,)]", done.stderr[-2000:]
