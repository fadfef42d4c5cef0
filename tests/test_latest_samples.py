"""The latest sample rows, one rule (issue #41): dbt's ``stg_latest_samples`` model is the only definition; the
warehouse's ``latest_samples`` view is that file rendered over ``samples`` (storage/sql_rules.py), and the flips
read that view. Checked on a warehouse that holds what the rule must see through: an older run, a failed and a
killed later run, two runs of one instant (run_id breaks the tie), a file of a release without the captioning
columns, and a compacted folder whose absorbed sources are still there (as between a compaction's publish and its
clean-up); dbt, building from the same files, gives the same rows and columns."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from clipcache.storage.compaction import compact
from clipcache.storage.results import warehouse_dir, write_sample_rows
from clipcache.storage.warehouse import connect
from clipcache.tasks.report.flips import unit_flips

from test_warehouse import T0, write_run

ROWS = "SELECT * FROM latest_samples ORDER BY experiment_id, unit, sample_index"


def _samples(out, run_id, when, experiment, correct, *, caption=True):
    n = len(correct)
    columns = {"target": np.arange(n), "prediction": np.where(correct, np.arange(n), n),
               "correct1": np.asarray(correct), "correct5": np.ones(n, bool), "top": np.tile(np.arange(3), (n, 1)),
               "rank": np.where(correct, 1, 2), "margin": np.linspace(-1, 1, n), "value": np.linspace(0, 1, n)}
    if caption:
        columns |= {"caption": [f"{experiment} {run_id} {i}" for i in range(n)],
                    "reference_captions": [[f"ref {i}", "other"] for i in range(n)]}
    return write_sample_rows(out, run_id, created_at=when, experiment_id=experiment, task="zeroshot_classification",
                             unit="image", columns=columns, keys=[f"img{i}.png" for i in range(n)])


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    """Experiments a (four runs: only the second is its latest completed one), b (two runs of one instant) and c
    (one run, in a file of an older release), and the run each must resolve to."""
    out = tmp_path_factory.mktemp("latest-samples") / "out"
    metric = [{"model": "m", "dataset": "d", "value": 0.5}]
    new = write_run(out, T0 + timedelta(days=1), metric)
    _samples(out, new, T0 + timedelta(days=1), "a", [True, False, True, False])
    failed = write_run(out, T0 + timedelta(days=2), metric, status="failed")
    _samples(out, failed, T0 + timedelta(days=2), "a", [False] * 4)
    _samples(out, "killed0000000000", T0 + timedelta(days=3), "a", [False] * 4)  # no run row: killed
    tied = sorted(write_run(out, T0, metric) for _ in range(2))
    for run_id in tied:
        _samples(out, run_id, T0, "b", [False, True, True, run_id == tied[1]])
    # compacted: the sources stay absorbed even while still present (put back one of them, as before clean-up)
    folder = warehouse_dir(out) / "samples"
    kept = out.parent / "kept.parquet"
    [source] = folder.glob(f"{new}-*.parquet")
    shutil.copy(source, kept)
    assert compact(out, "samples").files_after == 1
    shutil.copy(kept, source)
    # an older run, in a file of a release without the captioning and hits_at columns (they read as typed nulls)
    old = write_run(out, T0, metric)
    older = _samples(out, old, T0, "a", [True] * 4, caption=False)
    only = write_run(out, T0, metric)  # experiment c: its one run in such a file
    for path in (older, _samples(out, only, T0, "c", [True, False], caption=False)):
        pq.write_table(pq.read_table(path).drop_columns(["caption", "reference_captions", "hits_at"]), path)
    return out, {"a": new, "b": tied[1], "c": only}


def test_the_view_keeps_the_latest_completed_run_and_every_column(warehouse):
    out, latest = warehouse
    con = connect(out)
    assert dict(con.execute("SELECT experiment_id, any_value(run_id) FROM latest_samples GROUP BY ALL "
                            "HAVING count(DISTINCT run_id) = 1").fetchall()) == latest
    assert con.execute("SELECT count(*) FROM latest_samples").fetchone() == (10,)  # the restored source not twice
    samples = con.execute("DESCRIBE samples").fetchall()
    assert con.execute("DESCRIBE latest_samples").fetchall() == samples
    assert {"caption", "reference_captions", "value", "top", "rank", "hits_at", "margin"} <= {r[0] for r in samples}
    assert con.execute("SELECT caption, reference_captions, top FROM latest_samples WHERE experiment_id = 'a' "
                       "AND sample_index = 1").fetchone() == (f"a {latest['a']} 1", ["ref 1", "other"], [0, 1, 2])
    assert con.execute("SELECT caption, reference_captions, hits_at, correct1 FROM latest_samples WHERE "
                       "experiment_id = 'c' ORDER BY sample_index").fetchall() == [(None, None, None, True),
                                                                                  (None, None, None, False)]


def test_flips_read_the_view(warehouse):
    out, _ = warehouse
    [image] = unit_flips(connect(out), "a", "b")
    # a: right on 0 and 2; b (its later run_id): right on 1, 2 and 3
    assert (image.n, image.a_correct, image.b_correct, image.a_only, image.b_only) == (4, 2, 3, 1, 2)
    assert [f.sample_index for f in image.shown_a_only] == [0]
    assert sorted(f.sample_index for f in image.shown_b_only) == [1, 3]


@pytest.mark.slow
def test_dbt_builds_the_same_rows_and_columns_from_the_same_file(warehouse):
    from clipcache.tasks.report.dbt_build import dbt_build

    out, _ = warehouse
    mart = duckdb.connect(str(dbt_build(out)), read_only=True)
    view = connect(out)
    assert mart.execute("DESCRIBE stg_latest_samples").fetchall() == view.execute("DESCRIBE latest_samples").fetchall()
    assert mart.execute(ROWS.replace("latest_samples", "stg_latest_samples")).fetchall() == \
        view.execute(ROWS).fetchall()
    mart.close()
    # a report's build runs the data tests, not the unit tests (fixed rows, checked in tests/test_group_marts.py)
    results = json.loads((out / "report" / "dbt_target" / "run_results.json").read_text())["results"]
    kinds = {r["unique_id"].split(".")[0] for r in results}
    assert kinds == {"model", "test"} and all(r["status"] in ("success", "pass") for r in results)
