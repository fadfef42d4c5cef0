"""Suites in the dbt marts and the HTML report (equal to `clipcache suite score`, partial suites labelled, the table
checked in headless Chromium), mteb's results folder read back by mteb itself, and the MIEB(lite) suite against
mteb's own benchmark definition."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest
from test_report_compare import chromium_dom

from clipcache.storage.warehouse import connect
from clipcache.tasks.suites import load_suite
from clipcache.tasks.suites.mteb_export import mieb_counterpart, mieb_tasks
from clipcache.tasks.suites.sql import register

from conftest import perturbed_tiny_model
from hostile import assert_refused, run_cli
from test_warehouse import T0, write_run

# the intervals of a suite_scores row (pretrained is null for most models: USING would drop them)
INTERVALS = ("left join suite_intervals i on i.suite = s.suite and i.model = s.model and i.pretrained is not "
             "distinct from s.pretrained and i.checkpoint = s.checkpoint and i.precision = s.precision")


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    """The shapes suite run by the bundled model and a perturbed copy (both complete, with per-sample rows), a
    third model with a result on `shapes` only (partial), and a `cifar10` zero-shot result for the mteb export."""
    from clipcache.flows.cli import main

    root = tmp_path_factory.mktemp("suite-reports")
    perturbed = root / "perturbed"
    perturbed_tiny_model(perturbed)
    out = root / "out"
    dirs = ["--output_dir", str(out), "--cache_dir", str(root / "cache"), "--quiet", "--orchestrator", "local"]
    assert main(["eval", "--suite", "shapes", "--model", "tiny-shapes-clip", f"local-dir:{perturbed}", *dirs]) == 0
    late = T0 + timedelta(days=400)  # newer than the real runs: no effect on them, they are other experiments
    write_run(out, late, [{"model": "half-done", "dataset": "shapes", "value": 0.5}])
    write_run(out, late, [{"model": "tiny-shapes-clip", "dataset": "cifar10", "value": 0.4321},
                          {"model": "tiny-shapes-clip", "dataset": "cifar10", "task": "linear_probe",
                           "metric": "lp_acc", "value": 0.9}])
    # what the mieb runner records (task mieb, mteb's main score), and a clipcache task's rows that must not count
    write_run(out, late, [{"model": "tiny-shapes-clip", "dataset": "mieb:STS13VisualSTS", "task": "mieb",
                           "metric": "mteb_main_score", "k": None, "value": 0.25},
                          {"model": "tiny-shapes-clip", "dataset": "mieb:STS13VisualSTS", "task": "visual_sts",
                           "metric": "cosine_spearman", "k": None, "value": 0.75}])
    return out


@pytest.fixture(scope="module")
def built(warehouse):
    """`clipcache report`: dbt build (suite marts included) and the HTML page."""
    from clipcache.flows.orchestration.launch import report
    from clipcache.flows.orchestration.reporting import ReportParams

    page = Path(report(ReportParams(output_dir=str(warehouse))))
    return page, warehouse / "report" / "reports.duckdb"


def _cli_scores(warehouse, capsys) -> dict[str, dict]:
    code, out, err = run_cli(["suite", "score", "shapes", "--output_dir", str(warehouse), "--format", "json"], capsys)
    assert code == 0, err
    return {p["model"]: p for p in json.loads(out)}


@pytest.mark.slow
def test_dbt_suite_marts_equal_suite_score_and_the_sql_views(built, warehouse, capsys):
    _, database = built
    cli = _cli_scores(warehouse, capsys)
    con = duckdb.connect(str(database), read_only=True)
    mart = {r[0]: r[1:] for r in con.execute(
        "select s.model, s.complete, s.coverage, s.score, s.normalized, s.partial_score, s.missing, "
        "s.datasets_present, s.datasets, i.rank, i.score_ci_low, i.score_ci_high, i.normalized_ci_low, "
        f"i.normalized_ci_high, i.not_separable_from from suite_scores s {INTERVALS} where s.suite = 'shapes'"
    ).fetchall()}
    assert set(mart) == {m for m, p in cli.items() if p["datasets_present"]} and len(mart) == 3
    for model, (complete, coverage, score, normalized, partial, missing, present, total, rank, lo, hi, nlo, nhi,
                not_separable) in mart.items():
        p = cli[model]
        assert (complete, present, total, list(missing)) == (p["complete"], p["datasets_present"], p["datasets"],
                                                             p["missing"])
        assert score == pytest.approx(p["score"], abs=1e-12) and normalized == pytest.approx(p["normalized"],
                                                                                            abs=1e-12)
        assert partial == pytest.approx(p["partial_score"], abs=1e-12)
        if complete:
            assert coverage == "complete" and score is not None and partial is None
            assert (rank, [lo, hi], [nlo, nhi], list(not_separable or [])) == (
                p["rank"], p["score_ci"], p["normalized_ci"], p["not_separable_from"])
            assert lo is not None and lo <= score <= hi  # the real runs have per-sample rows
        else:  # a partial suite is labelled, never a bare score, and has no interval or rank
            assert coverage == "partial: 1 of 2" and score is None and normalized is None and rank is None
            assert list(missing) == ["shapes_retrieval"] and partial == pytest.approx(0.5)
    # per dataset, the mart's main metric is the one `suite score` used
    per_dataset = {(m, d): v for m, d, v in con.execute(
        "select model, dataset, value from suite_results where suite = 'shapes'").fetchall()}
    for model, p in cli.items():
        for d in p["per_dataset"]:
            assert per_dataset.get((model, d["dataset"])) == (None if d["value"] is None else pytest.approx(
                d["value"], abs=1e-12))
    # and the warehouse's own suite views give the same scores
    sql = connect(warehouse)
    register(sql)
    view = {r[0]: r[1:] for r in sql.execute("select model, score, normalized, partial_score from suite_scores "
                                             "where suite = 'shapes'").fetchall()}
    assert set(view) == set(mart)
    for model, values in view.items():
        assert [None if v is None else pytest.approx(v, abs=1e-12) for v in values] == list(mart[model][2:5])
    # the shipped suites are all there, one row per dataset part
    parts = dict(con.execute("select suite, count(*) from stg_suite_datasets group by suite").fetchall())
    assert parts["shapes"] == 3 and parts["mieb_lite"] == 51
    con.close()


@pytest.mark.slow
def test_report_suite_table_in_chromium_equals_sql(built, tmp_path):
    page, database = built
    dom, console = chromium_dom(page, tmp_path / "profile")
    assert console == []
    table = re.search(r'<table id="suites">(.*?)</table>', dom, re.S)
    assert table, "no suite table on the page"
    rows = {}
    for suite, model, cells in re.findall(r'<tr data-suite="([^"]+)" data-model="([^"]+)">(.*?)</tr>',
                                          table.group(1), re.S):
        text = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", cells,
                                                                                       re.S)]
        rows[html.unescape(suite), html.unescape(model)] = text
    con = duckdb.connect(str(database), read_only=True)
    expected = con.execute(
        "select s.suite, s.model_label, s.complete, s.score, s.normalized, s.datasets_present, s.datasets, i.rank, "
        f"i.score_ci_low, i.score_ci_high from suite_scores s {INTERVALS}").fetchall()
    con.close()
    assert set(rows) == {(r[0], r[1]) for r in expected}
    for suite, label, complete, score, normalized, present, total, rank, lo, hi in expected:
        _, shown_rank, _, shown_score, interval, shown_normalized, _, coverage, _ = rows[suite, label]
        assert coverage == f"{present}/{total}"
        if complete:
            assert shown_score == f"{score:.4f}" and shown_normalized == f"{normalized:.4f}"
            assert shown_rank == str(rank) and interval == f"{lo:.4f}–{hi:.4f}"
        else:
            assert shown_score.startswith(f"partial: {present} of {total}") and "missing: " in shown_score
            assert shown_rank == "" and shown_normalized == "" and interval == ""
    partial = rows["shapes", "half-done"][3]
    assert "missing: shapes_retrieval" in partial and "not a suite score" in partial


def test_the_mieb_lite_suite_is_mtebs_benchmark():
    import mteb

    benchmark = mteb.get_benchmark("MIEB(lite)")
    suite = load_suite("mieb_lite")
    assert [e.source_key for e in suite.datasets] == [t.metadata.name for t in benchmark.tasks]
    for entry, task in zip(suite.datasets, benchmark.tasks, strict=True):
        meta = task.metadata
        mapped = mieb_counterpart(entry.dataset, entry.split)
        assert mapped is not None and mapped.name == meta.name and mapped.main_score == meta.main_score
        assert entry.runnable and entry.note
        if not entry.dataset.startswith("mieb:"):  # a clip_benchmark dataset whose result is MIEB's number
            assert meta.main_score == "accuracy" and meta.type == "ZeroShotClassification"
            assert (entry.task, entry.main_metric) == ("zeroshot_classification", "acc1") and entry.chance
        else:  # mteb's own task, run by the mieb runner
            assert entry.dataset == f"mieb:{meta.name}" and entry.split == meta.eval_splits[0]
            assert (entry.task, entry.main_metric) == ("mieb", "mteb_main_score")
    assert sum(not e.dataset.startswith("mieb:") for e in suite.datasets) == 7


def test_the_mieb_mapping_is_mtebs_task_metadata():
    import mteb

    for name, task in mieb_tasks().items():
        meta = mteb.get_task(name).metadata
        assert (task.type, task.main_score, task.split, task.revision) == (
            meta.type, meta.main_score, meta.eval_splits[0], meta.revision), name
        assert task.subsets == {k: sorted(v) for k, v in meta.hf_subsets_to_langscripts.items()}, name
        assert not task.datasets or (task.task, task.metric) == ("zeroshot_classification", "acc1")
    assert mieb_counterpart("cifar10", "test").name == "CIFAR10ZeroShot"
    assert mieb_counterpart("food101", "test").split == "validation"  # torchvision's test is HF's validation
    assert mieb_counterpart("cifar10", "train") is None and mieb_counterpart("shapes", "test") is None


@pytest.mark.slow
def test_mteb_export_round_trips_through_mtebs_result_loading(warehouse, tmp_path, capsys):
    import mteb

    suite = tmp_path / "mteb_suite.yaml"
    suite.write_text("name: mteb_suite\ndatasets:\n  - dataset: cifar10\n  - dataset: shapes\n"
                     "  - dataset: \"mieb:STS13VisualSTS\"\n    task: mieb\n    main_metric: mteb_main_score\n")
    out = tmp_path / "mteb_cache"
    code, stdout, err = run_cli(["suite", "export", str(suite), "--format", "mteb", "--out", str(out),
                                 "--output_dir", str(warehouse)], capsys)
    assert code == 0, err
    assert "2 mteb task result(s) of 1 model(s)" in stdout
    folder = out / "results" / "tiny-shapes-clip" / "no_revision_available"
    assert sorted(p.name for p in folder.iterdir()) == ["CIFAR10ZeroShot.json", "STS13VisualSTS.json",
                                                        "model_meta.json"]
    one = mteb.TaskResult.from_disk(folder / "CIFAR10ZeroShot.json")
    assert one.task_name == "CIFAR10ZeroShot" and one.get_score() == pytest.approx(0.4321)  # zero-shot, not probe
    results = mteb.ResultCache(out).load_results(include_remote=False, validate_and_filter=True,
                                                 tasks=["CIFAR10ZeroShot", "STS13VisualSTS"])
    (model,) = results.model_results
    assert (model.model_name, model.model_revision) == ("tiny-shapes-clip", "no_revision_available")
    scores = {r.task_name: r.get_score() for r in model.task_results}
    assert scores == {"CIFAR10ZeroShot": pytest.approx(0.4321), "STS13VisualSTS": pytest.approx(0.25)}
    scores_field = json.loads((folder / "STS13VisualSTS.json").read_text())["scores"]["test"][0]
    assert scores_field["cosine_spearman"] == scores_field["main_score"] == 0.25
    # a suite none of whose results is a MIEB task is refused in one line
    code, _, err = run_cli(["suite", "export", "shapes", "--format", "mteb", "--out", str(tmp_path / "none"),
                            "--output_dir", str(warehouse)], capsys)
    assert_refused(code, err, "is a MIEB task")
