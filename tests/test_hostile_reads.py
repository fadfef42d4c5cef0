"""Reads beside `results compact` (issue #45, case 6): `suite score`, `compare` and `query` see the result files as
they were before a compaction or as they are after it, never a DuckDB IOException traceback (docs/results.md: "safe
at every instant"). A compaction replaces files under a reader in two ways, both tested: between the moment the
reader lists the files and the moment it reads them (made to happen every time, so the case cannot pass by luck),
and as it happens, with compaction loops running beside the commands."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from clipcache.storage.compaction import compact
from clipcache.storage.results import TABLES, warehouse_dir
from clipcache.storage.warehouse import open_warehouse

from conftest import perturbed_tiny_model
from hostile import run_cli
from test_warehouse import T0, write_run

pytestmark = pytest.mark.hostile


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Two checkpoints evaluated on 64 shapes images (per-sample rows for `compare`), a one-dataset suite."""
    from clipcache.flows.cli import main

    root = tmp_path_factory.mktemp("hostile-reads")
    perturbed_tiny_model(root / "perturbed")
    assert main(["eval", "--model", "tiny-shapes-clip", f"local-dir:{root / 'perturbed'}", "--dataset", "shapes",
                 "--limit", "64", "--quiet", "--orchestrator", "local", "--output_dir", str(root / "out"),
                 "--cache_dir", str(root / "cache")]) == 0
    (root / "suite.yaml").write_text("name: one\ndatasets:\n  - dataset: shapes\n")
    return root


def commands(work):
    out = str(work / "out")
    return {
        "suite score": ["suite", "score", str(work / "suite.yaml"), "--output_dir", out, "--bootstrap", "10",
                        "--format", "json"],
        "compare": ["compare", "--baseline", "tiny-shapes-clip", "--candidate", "perturbed", "--output_dir", out,
                    "--bootstrap", "10", "--format", "json"],
        "query": ["query", "SELECT model, dataset, metric, k, value FROM metrics WHERE model <> 'bystander' "
                           "ORDER BY ALL", "--output_dir", out, "--format", "json"],
    }


def answer(argv, capsys):
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and "Traceback" not in err, err
    return json.loads(out)


def new_files_and_compaction(out) -> None:
    """What a nightly job beside the readers does: a new run (of a model no answer here includes), then a
    compaction of every table, which removes the files it merged."""
    write_run(out, T0 + timedelta(days=500), [{"model": "bystander", "dataset": "cifar10", "value": 0.5}])
    for table in TABLES:
        compact(out, table)


# The function each command calls after it listed the files and before it reads them.
BETWEEN_LISTING_AND_READING = {"suite score": "clipcache.tasks.suites.scoring.score_suite",
                               "compare": "clipcache.tasks.report.compare.compare",
                               "query": "clipcache.tasks.suites.sql.register"}


@pytest.mark.parametrize("command", list(BETWEEN_LISTING_AND_READING))
def test_a_compaction_between_listing_and_reading(work, capsys, monkeypatch, command):
    argv = commands(work)[command]
    before = answer(argv, capsys)
    module_name, name = BETWEEN_LISTING_AND_READING[command].rsplit(".", 1)
    module = __import__(module_name, fromlist=[name])
    real = getattr(module, name)
    compactions = []

    def compacting_first(*args, **kwargs):
        if not compactions:
            compactions.append(1)
            new_files_and_compaction(work / "out")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, compacting_first)
    assert answer(argv, capsys) == before
    assert compactions == [1]


def test_read_consistently_starts_over_only_when_files_moved(work):
    from clipcache.storage.warehouse import read_consistently

    out = work / "out"
    calls = []

    def read(warehouse):
        calls.append(1)
        if len(calls) == 1:
            new_files_and_compaction(out)
        return warehouse.con.sql("SELECT count(*) FROM metrics WHERE model <> 'bystander'").fetchall()

    expected = open_warehouse(out).con.sql("SELECT count(*) FROM metrics WHERE model <> 'bystander'").fetchall()
    assert read_consistently(out, read) == expected and len(calls) == 2
    # a failure of its own (no file moved) is not retried
    calls.clear()

    def bad(warehouse):
        calls.append(1)
        return warehouse.con.sql("SELECT no_such_column FROM metrics").fetchall()

    with pytest.raises(Exception, match="no_such_column"):
        read_consistently(out, bad)
    assert calls == [1]


def test_reads_during_compaction_loops(work, capsys):
    """Compactions in a loop beside the commands: every answer equals the answer without them."""
    argv = commands(work)
    before = {name: answer(a, capsys) for name, a in argv.items()}
    done = threading.Event()
    failures: list[BaseException] = []

    def loop():
        try:
            for _ in range(8):
                new_files_and_compaction(work / "out")
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            failures.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=loop)
    thread.start()
    rounds = 0
    try:
        while not done.is_set() and rounds < 40:
            for name, a in argv.items():
                assert answer(a, capsys) == before[name], name
            rounds += 1
    finally:
        thread.join()
    assert not failures, failures
    assert rounds >= 1
    assert len(list((warehouse_dir(work / "out") / "metrics").glob("*.parquet"))) == 1  # compacted to one file
