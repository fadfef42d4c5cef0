"""The group marts of the dbt project (issue #27): group_accuracy, face_group_metrics and group_metrics built by dbt
from the warehouse's sample and sample_metadata files, equal on a real run to the metric rows the evaluation wrote
(checked against scikit-learn and hand computations in test_group_metrics.py) and to the warehouse's views, which
render the same model files for DuckDB (issue #41: one definition, two renderings, storage/sql_rules.py); their
schema tests run in the same `dbt build`."""

from __future__ import annotations

import json

import duckdb
import pytest
from test_group_intervals import GROUP_SETS, evaluate_group_sets

from clipcache import connect
from clipcache.tasks.suites import groups
from clipcache.tasks.suites.sql import register


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The group sets and FairFace evaluated, then `dbt build` (models, schema tests, and the project's unit tests,
    which `clipcache report` leaves out: this build is where they run) over them."""
    from clipcache.tasks.report.dbt_build import dbt_build

    base = tmp_path_factory.mktemp("group-marts")
    evaluate_group_sets(base)
    return base / "out", dbt_build(base / "out", unit_tests=True)


def _rows(con, sql: str) -> dict[tuple, tuple]:
    """key columns (all but the last two) -> the last two."""
    return {tuple(r[:-2]): tuple(r[-2:]) for r in con.execute(sql).fetchall()}


@pytest.mark.slow
def test_group_marts_equal_the_metric_rows_and_the_views_rendered_from_the_same_files(built):
    out, database = built
    mart = duckdb.connect(str(database), read_only=True)
    view = connect(str(out))
    register(view)
    # group_metrics: every (experiment, metric) of the view, the same value and group count, and the model's name
    in_mart = _rows(mart, "select experiment_id, metric, value, groups from group_metrics")
    in_view = _rows(view, "select experiment_id, metric, value, groups from group_metrics")
    assert set(in_mart) == set(in_view)
    for key, (value, n) in in_view.items():
        assert in_mart[key] == (pytest.approx(value, abs=1e-12), n), key
    datasets = {d for (d,) in mart.execute("select distinct dataset from group_metrics").fetchall()}
    assert datasets == {*GROUP_SETS, "fairness/fairface"}
    assert {m for (m,) in mart.execute("select distinct model from group_metrics").fetchall()} == {"tiny-shapes-clip"}
    # ... and the metric rows the evaluation wrote (NumPy), DataComp's main metrics and every face metric
    rows = _rows(view, "select experiment_id, metric, value, n_samples from metrics")
    for (experiment, metric), (value, _) in in_mart.items():
        assert rows[(experiment, metric)][0] == pytest.approx(value, abs=1e-9), metric
    main = {m for name, m, _, _ in groups.definitions() if name in GROUP_SETS}
    assert main <= {m for _, m in in_mart}
    # group_accuracy and face_group_metrics: row for row
    for sql in ("select experiment_id, field, code, label, n, acc1 from group_accuracy",
                "select experiment_id, name, n, value from face_group_metrics"):
        got, expected = _rows(mart, sql), _rows(view, sql)
        assert got.keys() == expected.keys() and len(got) > 10
        for key, (n, value) in expected.items():
            assert got[key] == (n, pytest.approx(value, abs=1e-12)), key
    # the definitions dbt was given are the warehouse's
    assert sorted(mart.execute("select * from stg_group_definitions").fetchall()) == sorted(groups.definitions())
    mart.close()


@pytest.mark.slow
def test_the_build_ran_and_passed_every_unit_test_and_data_test_of_the_project(built):
    out, _ = built
    manifest = json.loads((out / "report" / "dbt_target" / "manifest.json").read_text())
    declared = set(manifest["unit_tests"]) | {n for n, node in manifest["nodes"].items()
                                              if node["resource_type"] == "test"}
    results = json.loads((out / "report" / "dbt_target" / "run_results.json").read_text())["results"]
    ran = {r["unique_id"]: r["status"] for r in results if r["unique_id"].startswith(("unit_test.", "test."))}
    assert ran.keys() == declared and set(ran.values()) == {"pass"}
    assert {n.split(".")[0] for n in ran} == {"unit_test", "test"}
