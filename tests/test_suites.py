"""Suites: the shipped files against their sources, honest averages (hand-computed, in Python and SQL), partial
scores labelled, intervals from the per-sample rows and the rank check, and `eval --suite` end to end."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from clipcache.storage.errors import ConfigError
from clipcache.storage.warehouse import connect
from clipcache.tasks.datasets.clip_benchmark.collections import canonical, dataset_collections
from clipcache.tasks.score.intervals import paired_draws, percentile_interval
from clipcache.tasks.suites import load_suite, metric_parts, shipped
from clipcache.tasks.suites.scoring import score_suite
from clipcache.tasks.suites.sql import register

from conftest import perturbed_tiny_model
from hostile import assert_refused, run_cli
from test_warehouse import T0, write_run

FIXTURES = Path(__file__).parent / "fixtures"


def test_datacomp_suite_has_datacomps_main_metrics_and_chance_scores():
    recorded = {}
    for line in (FIXTURES / "datacomp_tasklist.tsv").read_text().splitlines():
        if line.startswith("#"):
            continue
        key, name, main_metric, random_score = line.split("\t")
        recorded[key] = (name, main_metric, float(random_score) if random_score else None)
    suite = load_suite("datacomp")
    assert len(suite.datasets) == 38  # DataComp scores 38 of its 40 tasks (FairFace and UTKFace have no main metric)
    assert {e.source_key for e in suite.datasets} == set(recorded) - {"fairness/fairface", "fairness/utkface"}
    for e in suite.datasets:
        name, main_metric, random_score = recorded[e.source_key]
        assert (e.name, e.main_metric) == (name, main_metric), e.dataset
        if random_score is not None:
            assert e.chance == random_score, e.dataset
    assert load_suite("datacomp").groups["VTAB"] and all(
        e.dataset == canonical(e.source_key) for e in suite.datasets if e.source_key.startswith("vtab/"))


def test_shipped_suites_load_and_collections_are_clip_benchmarks():
    for name in shipped():
        suite = load_suite(name)
        assert suite.name == name and suite.datasets
    for name, members in dataset_collections().items():
        assert [e.dataset for e in load_suite(name).datasets] == [canonical(m) for m in members]
    vtab = {canonical(m) for m in dataset_collections()["vtab"]}
    parts = [load_suite(f"vtab_{g}") for g in ("natural", "specialized", "structured")]
    assert sum(len(p.datasets) for p in parts) == 19 and {e.dataset for p in parts for e in p.datasets} == vtab
    assert metric_parts("mean_recall@5") == [("image_retrieval_recall", 5), ("text_retrieval_recall", 5)]
    assert metric_parts("acc1") == [("acc", 1)] and metric_parts("mean_per_class_recall") == [
        ("mean_per_class_recall", None)]


@pytest.mark.parametrize("body, field", [
    ("name: s\ndatasets: []\n", "datasets"),
    ("name: s\ndatasets:\n  - dataset: a\n    chance: 1.5\n", "datasets.0.chance"),
    ("name: s\ndatasets:\n  - dataset: a\n    colour: red\n", "datasets.0.colour"),
    ("name: s\ndatasets:\n  - dataset: a\n  - dataset: a\n", "listed twice"),
    ("name: s\ngroups: {g: [b]}\ndatasets:\n  - dataset: a\n", "group 'g' names b"),
    ("[1, 2]\n", "expected a mapping"),
    ("name: s\ndatasets: [\n", "cannot read it"),
])
def test_a_bad_suite_file_is_one_line_naming_the_field(tmp_path, body, field):
    path = tmp_path / "suite.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError, match="suite .*" + field.replace(".", r"\.")):
        load_suite(str(path))


def _suite_file(tmp_path, extra: str = "") -> str:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ndatasets:\n"
                    "  - dataset: cls\n    main_metric: acc1\n    chance: 0.1\n"
                    "  - dataset: ret\n    main_metric: mean_recall@1\n    chance: 0.0\n" + extra)
    return str(path)


@pytest.fixture
def two_models(tmp_path):
    """model-a and model-b on a classification and a retrieval dataset; model-b's newer night is the current one."""
    out = tmp_path / "outputs"
    for night, (a_acc, b_acc) in enumerate([(0.70, 0.80), (0.72, 0.60)]):
        for model, acc in (("model-a", a_acc), ("model-b", b_acc)):
            write_run(out, T0 + timedelta(days=night), [
                {"model": model, "dataset": "cls", "metric": "acc", "k": 1, "value": acc},
                *[{"model": model, "dataset": "ret", "task": "zeroshot_retrieval", "metric": f"{d}_retrieval_recall",
                   "k": 1, "value": acc + bonus} for d, bonus in (("image", 0.1), ("text", 0.05))]])
    return out


def test_suite_score_equals_a_hand_computation_in_python_and_sql(two_models, tmp_path):
    suite = load_suite(_suite_file(tmp_path))
    con = connect(two_models)
    register(con, [_suite_file(tmp_path)])
    expected = {}
    for model, acc in (("model-a", 0.72), ("model-b", 0.60)):
        retrieval = ((acc + 0.1) + (acc + 0.05)) / 2
        expected[model] = ((acc + retrieval) / 2, ((acc - 0.1) / 0.9 + retrieval) / 2)
    scores = {s.model[0]: s for s in score_suite(con, suite, resamples=0)}
    sql = {r[0]: r[1:] for r in con.execute("SELECT model, score, normalized, partial_score, complete FROM "
                                            "suite_scores WHERE suite = 'mine'").fetchall()}
    for model, (score, normalized) in expected.items():
        assert scores[model].score == pytest.approx(score, abs=1e-12)
        assert scores[model].normalized == pytest.approx(normalized, abs=1e-12)
        assert sql[model][:2] == pytest.approx((score, normalized), abs=1e-12) and sql[model][2:] == (None, True)
    assert scores["model-a"].rank == 1 and scores["model-b"].rank == 2
    # no per-sample rows: no interval, and the two models are not called separable
    assert scores["model-a"].score_ci == (None, None) and scores["model-a"].not_separable_from == ["model-b"]


def test_a_missing_dataset_gives_a_labelled_partial_score_never_a_bare_number(two_models, tmp_path, capsys):
    path = _suite_file(tmp_path, "  - dataset: never_run\n    chance: 0.5\n")
    con = connect(two_models)
    register(con, [path])
    score = next(s for s in score_suite(con, load_suite(path), resamples=0) if s.model[0] == "model-a")
    assert score.score is None and score.normalized is None and score.rank is None
    assert [e.dataset for e in score.missing] == ["never_run"]
    assert score.partial_score == pytest.approx((0.72 + (0.82 + 0.77) / 2) / 2)
    assert con.execute("SELECT score, partial_score, datasets_present, datasets FROM suite_scores WHERE suite = "
                       "'mine' AND model = 'model-a'").fetchone() == (None, pytest.approx(score.partial_score), 2, 3)
    code, output, _ = run_cli(["suite", "score", path, "--output_dir", str(two_models), "--bootstrap", "0"], capsys)
    assert code == 0
    assert "partial 0.7575" in output and "never_run" in output and "not comparable" in output


def test_a_dataset_listed_in_a_second_language_counts_as_its_own_dataset(two_models, tmp_path):
    """A suite may list one dataset in two languages (entries are unique by dataset, split and language): a model
    with only the English result is partial in SQL as in Python, never a complete score over fewer datasets."""
    path = _suite_file(tmp_path, "  - dataset: cls\n    language: jp\n    main_metric: acc1\n    chance: 0.1\n")
    con = connect(two_models)
    register(con, [path])
    score = next(s for s in score_suite(con, load_suite(path), resamples=0) if s.model[0] == "model-a")
    assert score.score is None and [(e.dataset, e.language) for e in score.missing] == [("cls", "jp")]
    assert con.execute("SELECT score, complete, datasets_present, datasets FROM suite_scores WHERE suite = 'mine' "
                       "AND model = 'model-a'").fetchone() == (None, False, 2, 3)


@pytest.mark.parametrize("argv, phrase", [
    (["--suite", "no_such_suite"], "unknown suite"),
    (["--suite", "shapes", "--task", "linear_probe"], "task: a suite runs"),
    (["--suite", "shapes", "--split", "train"], "split: suite shapes evaluates shapes with split test"),
])
def test_a_suite_run_that_cannot_be_done_is_refused_in_one_line(capsys, argv, phrase):
    code, _, err = run_cli(["eval", *argv, "--model", "tiny-shapes-clip"], capsys)
    assert_refused(code, err, phrase)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """`eval --suite shapes` for the bundled model; a perturbed copy evaluated on the classification set only."""
    from clipcache.flows.cli import main

    root = tmp_path_factory.mktemp("suites")
    perturbed = root / "perturbed"
    perturbed_tiny_model(perturbed)
    dirs = ["--output_dir", str(root / "out"), "--cache_dir", str(root / "cache"), "--quiet", "--orchestrator",
            "local"]
    assert main(["eval", "--suite", "shapes", "--model", "tiny-shapes-clip", *dirs]) == 0
    assert main(["eval", "--dataset", "shapes", "--model", f"local-dir:{perturbed}", *dirs]) == 0
    return root / "out"


def test_eval_suite_runs_every_dataset_and_the_interval_comes_from_the_sample_rows(evaluated):
    con = connect(evaluated)
    suite = load_suite("shapes")
    scores = {s.model[0]: s for s in score_suite(con, suite, resamples=200, seed=3)}
    base = scores["tiny-shapes-clip"]
    assert base.complete and base.score == pytest.approx(np.mean([r.value for r in base.results]))
    other = next(s for name, s in scores.items() if name != "tiny-shapes-clip")
    assert not other.complete and [e.dataset for e in other.missing] == ["shapes_retrieval"]
    # the classification part of the interval, by hand from the sample rows
    correct = np.array([r[0] for r in con.execute(
        "SELECT correct1 FROM latest_samples WHERE experiment_id = ? ORDER BY sample_index",
        [base.results[0].experiment_id]).fetchall()], dtype=np.float64)
    assert correct.mean() == pytest.approx(base.results[0].value, abs=1e-12)
    from clipcache.tasks.suites.scoring import _seed

    by_hand = paired_draws(lambda idx: correct[idx].mean(axis=1), len(correct), resamples=200,
                           seed=_seed("shapes", "image", 3))
    assert np.array_equal(base.results[0].draws, by_hand)
    if base.results[1].draws is not None:  # retrieval rows with per-query hits: the suite interval exists
        low, high = base.score_ci
        assert low is not None and high is not None and low <= base.score <= high
        assert (low, high) == percentile_interval((by_hand + base.results[1].draws) / 2)


def test_rank_check_uses_paired_resamples(evaluated, tmp_path):
    """On a one-dataset suite both models are complete: the perturbed model is separable from the bundled one
    exactly when the paired bootstrap interval of their difference excludes 0."""
    path = tmp_path / "one.yaml"
    path.write_text("name: one\ndatasets:\n  - dataset: shapes\n    chance: 0.033333\n")
    scores = score_suite(connect(evaluated), load_suite(str(path)), resamples=300)
    assert all(s.complete and s.rank for s in scores) and len(scores) == 2
    a, b = sorted(scores, key=lambda s: s.rank or 0)
    low, high = percentile_interval(a.suite_draws() - b.suite_draws())
    assert low is not None and high is not None
    assert (b.label in a.not_separable_from) == (low <= 0 <= high)
    assert a.score_ci[0] <= a.score <= a.score_ci[1]


def test_suite_score_cli_json(evaluated, capsys):
    code, out, _ = run_cli(["suite", "score", "shapes", "--output_dir", str(evaluated), "--format", "json",
                            "--bootstrap", "50"], capsys)
    assert code == 0
    payload = {p["model"]: p for p in json.loads(out)}
    assert payload["tiny-shapes-clip"]["complete"] and payload["tiny-shapes-clip"]["score"] is not None
    partial = next(p for name, p in payload.items() if name != "tiny-shapes-clip")
    assert partial["score"] is None and partial["partial_score"] is not None
    assert partial["missing"] == ["shapes_retrieval"]


def test_exports_in_open_clips_and_datacomps_layouts(evaluated, tmp_path, capsys):
    out = tmp_path / "openclip_results.csv"
    code, _, err = run_cli(["suite", "export", "shapes", "--format", "openclip", "--out", str(out), "--output_dir",
                            str(evaluated)], capsys)
    assert code == 0, err
    lines = out.read_text().splitlines()
    assert lines[0] == "name,pretrained,Average perf. on 2 datasets,Shapes,Shapes retrieval"
    base = next(line.split(",") for line in lines[1:] if line.startswith("tiny-shapes-clip,"))
    partial = next(line.split(",") for line in lines[1:] if not line.startswith("tiny-shapes-clip,"))
    assert base[2] and float(base[2]) == pytest.approx((float(base[3]) + float(base[4])) / 2, abs=1e-4)
    assert partial[2] == "" and partial[4] == ""  # an incomplete suite has no average, not a partial one
    code, _, err = run_cli(["suite", "export", "shapes", "--format", "datacomp", "--out", str(tmp_path / "x.jsonl"),
                            "--output_dir", str(evaluated)], capsys)
    assert_refused(code, err, "choose one with --model")
    code, _, err = run_cli(["suite", "export", "shapes", "--format", "datacomp", "--out", str(tmp_path / "x.jsonl"),
                            "--output_dir", str(evaluated), "--model", "tiny-shapes-clip"], capsys)
    assert code == 0, err
    lines = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == ["shapes", "shapes_retrieval"]
    assert lines[0]["metrics"]["main_metric"] == lines[0]["metrics"]["acc1"]
    retrieval = lines[1]["metrics"]
    assert retrieval["main_metric"] == pytest.approx(
        (retrieval["image_retrieval_recall@1"] + retrieval["text_retrieval_recall@1"]) / 2)
    code, _, err = run_cli(["suite", "export", "shapes", "--format", "openclip", "--out",
                            str(evaluated / "warehouse" / "x.csv"), "--output_dir", str(evaluated)], capsys)
    assert_refused(code, err, "inside the results warehouse")


def test_a_published_table_is_checked_against_our_values_and_intervals(evaluated, tmp_path, capsys):
    con = connect(evaluated)
    acc = con.execute("SELECT value FROM leaderboard WHERE model = 'tiny-shapes-clip' AND dataset = 'shapes' AND "
                      "metric = 'acc' AND k = 1").fetchone()[0]
    published = tmp_path / "paper.csv"
    # in percent, as papers print them: one value ours to the digit, one far off, one model we never ran
    published.write_text("name,pretrained,Shapes,Shapes retrieval\n"
                         f"tiny-shapes-clip,,{acc * 100:.2f},5.0\nsome-other-model,x,50.0,5.0\n")
    code, out, err = run_cli(["suite", "check", "shapes", "--published", str(published), "--output_dir",
                              str(evaluated), "--format", "json", "--bootstrap", "200"], capsys)
    assert code == 0, err
    rows = {r["dataset"]: r for r in json.loads(out)}
    assert set(rows) == {"shapes", "shapes_retrieval"}
    assert rows["shapes"]["published"] == pytest.approx(acc, abs=1e-4) and rows["shapes"]["verdict"] == "within"
    far = rows["shapes_retrieval"]
    assert far["published"] == pytest.approx(0.05) and far["difference"] > 0.1
    assert far["verdict"] in ("outside our interval", "no interval")  # no interval without per-query hit rows
    published.write_text("name,pretrained,Nothing here\ntiny-shapes-clip,,1\n")
    code, _, err = run_cli(["suite", "check", "shapes", "--published", str(published), "--output_dir",
                            str(evaluated)], capsys)
    assert_refused(code, err, "no column of")


def test_model_filters_take_a_model_as_eval_took_it(evaluated, tmp_path, capsys):
    """suite score / export / check --model resolve through compare's selectors: the folder as eval was given it
    (local-dir:PATH or the path), an experiment id prefix; a name that fits nothing is refused in one line."""
    perturbed = evaluated.parent / "perturbed"
    base = next(s for s in score_suite(connect(evaluated), load_suite("shapes"), resamples=0)
                if s.model[0] == "tiny-shapes-clip")
    prefix = base.results[0].experiment_id[:10]
    wanted = {f"local-dir:{perturbed}": "partial", str(perturbed): "partial", prefix: "tiny-shapes-clip",
              "tiny-shapes-clip": "tiny-shapes-clip"}
    for selector, model in wanted.items():
        code, out, err = run_cli(["suite", "score", "shapes", "--output_dir", str(evaluated), "--format", "json",
                                  "--bootstrap", "0", "--model", selector], capsys)
        assert code == 0, (selector, err)
        [payload] = json.loads(out)
        assert (payload["model"] == "tiny-shapes-clip") == (model == "tiny-shapes-clip"), selector
        assert payload["complete"] == (model == "tiny-shapes-clip")
    csv = tmp_path / "one.csv"
    code, _, err = run_cli(["suite", "export", "shapes", "--format", "openclip", "--out", str(csv), "--output_dir",
                            str(evaluated), "--model", f"local-dir:{perturbed}"], capsys)
    assert code == 0, err
    assert len(csv.read_text().splitlines()) == 2 and "tiny-shapes-clip" not in csv.read_text()
    published = tmp_path / "paper.csv"
    published.write_text("name,pretrained,Shapes\ntiny-shapes-clip,,50.0\n")
    for selector, rows in ((prefix, 1), (str(perturbed), 0)):
        code, out, err = run_cli(["suite", "check", "shapes", "--published", str(published), "--output_dir",
                                  str(evaluated), "--format", "json", "--bootstrap", "0", "--model", selector],
                                 capsys)
        assert code == 0 and len(json.loads(out)) == rows, (selector, err)
    for command in (["score"], ["export", "--format", "openclip", "--out", str(csv)]):
        code, _, err = run_cli(["suite", command[0], "shapes", *command[1:], "--output_dir", str(evaluated),
                                "--model", str(tmp_path / "nothing")], capsys)
        assert_refused(code, err, "names no model with results here")
