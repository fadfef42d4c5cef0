"""Evidence end to end: sample rows in the warehouse recompute the stored metrics, intervals reach the leaderboard and
the JSON, and `clipcache compare` pairs two checkpoints sample by sample (its flips equal SQL's)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from test_experiments import ARCH, checkpoints  # noqa: F401 (a fixture)

from clipcache.storage.warehouse import connect

from conftest import perturbed_tiny_model
from hostile import assert_refused, run_cli

COMMON = ["--dataset", "shapes", "--quiet", "--orchestrator", "local"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The bundled model and a perturbed copy of it (noise on the image tower), each evaluated on 300 images."""
    from clipcache.flows.cli import main

    root = tmp_path_factory.mktemp("compare")
    perturbed = root / "perturbed"
    perturbed_tiny_model(perturbed)
    dirs = ["--output_dir", str(root / "out"), "--cache_dir", str(root / "cache")]
    for model in ("tiny-shapes-clip", f"local-dir:{perturbed}"):
        assert main(["eval", "--model", model, *COMMON, "--limit", "300", *dirs]) == 0
    return root


def test_sample_rows_recompute_every_stored_metric(work):
    con = connect(work / "out")
    rows = con.sql("""
        SELECT m.experiment_id, m.metric, m.k, m.value, m.ci_low, m.ci_high,
               avg(s.correct1::DOUBLE) AS acc1, avg(s.correct5::DOUBLE) AS acc5, count(*) AS n
        FROM metrics m JOIN latest_samples s USING (experiment_id)
        GROUP BY ALL ORDER BY ALL""").fetchall()
    assert len(rows) == 6
    for _, metric, k, value, low, high, acc1, acc5, n in rows:
        assert n == 300 and low <= value <= high
        if metric == "acc":
            assert value == (acc1 if k == 1 else acc5)


def test_intervals_reach_the_json(work):
    [saved] = (work / "out" / "tiny-shapes-clip").glob("shapes_*.json")
    intervals = json.loads(saved.read_text())["intervals"]
    assert set(intervals) == {"acc1", "acc5", "mean_per_class_recall"}
    assert all(low <= high for low, high in intervals.values())


def test_compare_finds_the_perturbed_checkpoint_worse_and_its_flips_equal_sql(work, capsys):
    code, out, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", "perturbed",
                              "--output_dir", str(work / "out"), "--format", "json"], capsys)
    assert code == 0, err
    rows = {r["metric"]: r for r in json.loads(out)}
    acc1 = rows["acc1"]
    assert acc1["verdict"] == "worse" and acc1["ci_high"] < 0 and acc1["p_value"] < 0.05
    flips = connect(work / "out").execute("SELECT count(*) FROM sample_flips(?, ?)",
                                          [acc1["baseline_experiment"], acc1["candidate_experiment"]]).fetchone()[0]
    assert flips == acc1["flipped_to_correct"] + acc1["flipped_to_wrong"] > 0
    assert rows["acc1"]["p_holm"] >= rows["acc1"]["p_value"]


def test_compare_refuses_experiments_over_other_samples(work, capsys):
    from clipcache.flows.cli import main

    dirs = ["--output_dir", str(work / "out"), "--cache_dir", str(work / "cache")]
    assert main(["eval", "--model", "tiny-shapes-clip", *COMMON, "--limit", "200", *dirs]) == 0
    con = connect(work / "out")
    small, full = (con.sql(f"SELECT DISTINCT experiment_id FROM metrics WHERE model = 'tiny-shapes-clip' AND "
                           f"sample_limit = {n}").fetchall()[0][0] for n in (200, 300))
    code, _, err = run_cli(["compare", "--baseline", full, "--candidate", small, "--output_dir", str(work / "out")],
                           capsys)
    assert_refused(code, err, "different samples")


def test_compare_names_an_unknown_side(work, capsys):
    code, _, err = run_cli(["compare", "--baseline", "nope", "--candidate", "tiny-shapes-clip", "--output_dir",
                            str(work / "out")], capsys)
    assert_refused(code, err, "no completed experiment matches 'nope'")


def retrieval_results(work):
    """Both models on 150 shapes_retrieval pairs, recall@1/5/10, in work/retrieval (cached after the first)."""
    from clipcache.flows.cli import main

    dirs = ["--output_dir", str(work / "retrieval"), "--cache_dir", str(work / "cache"), "--quiet", "--orchestrator",
            "local", "--dataset", "shapes_retrieval", "--limit", "150", "--recall_k", "1", "5", "10"]
    if not (work / "retrieval").exists():
        for model in ("tiny-shapes-clip", f"local-dir:{work / 'perturbed'}"):
            assert main(["eval", "--model", model, *dirs]) == 0


def test_compare_pairs_retrieval_queries_per_direction_and_k(work, capsys):
    """Retrieval rows share sample indices across units (text and image queries): each direction is compared on its
    own queries, per k, and its flips equal sample_flips' rows of that unit."""
    retrieval_results(work)
    code, out, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", "perturbed",
                              "--output_dir", str(work / "retrieval"), "--format", "json"], capsys)
    assert code == 0, err
    rows = {r["metric"]: r for r in json.loads(out)}
    assert list(rows) == [f"{d}_retrieval_recall@{k}" for d in ("image", "text") for k in (1, 5, 10)]  # by k
    con = connect(work / "retrieval")
    for metric, row in rows.items():
        stored = con.execute("SELECT value FROM metrics WHERE experiment_id = ? AND metric = ? AND k = ?",
                             [row["baseline_experiment"], *metric.rsplit("@", 1)]).fetchone()[0]
        assert row["baseline"] == pytest.approx(stored, abs=1e-6)
    for direction, unit in (("image", "text_query"), ("text", "image_query")):
        row = rows[f"{direction}_retrieval_recall@1"]
        flips = con.execute("SELECT count(*) FROM sample_flips(?, ?) WHERE unit = ?",
                            [row["baseline_experiment"], row["candidate_experiment"], unit]).fetchone()[0]
        assert flips == row["flipped_to_correct"] + row["flipped_to_wrong"]


def test_compare_takes_a_model_as_eval_took_it(work, capsys):
    """local-dir:PATH, the folder itself and an experiment id prefix name the same experiments as the results' own
    label (the folder's name)."""
    out = ["--output_dir", str(work / "out")]
    expected = None
    for candidate in ("perturbed", f"local-dir:{work / 'perturbed'}", str(work / "perturbed")):
        code, text, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", candidate, *out,
                                   "--format", "json"], capsys)
        assert code == 0, (candidate, err)
        rows = json.loads(text)
        expected = expected or rows
        assert [r["candidate_experiment"] for r in rows] == [r["candidate_experiment"] for r in expected]
    experiment = expected[0]["candidate_experiment"]
    code, text, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", experiment[:10], *out,
                               "--format", "json"], capsys)
    assert code == 0 and json.loads(text)[0]["candidate_experiment"] == experiment, err


def test_an_ambiguous_name_lists_the_candidates_in_one_line(work, capsys):
    """Two folders named perturbed with other weights: the name fits two models; each folder's path still names
    one."""
    from clipcache.flows.cli import main

    other = perturbed_tiny_model(work / "other" / "perturbed", spread=0.5)
    out = ["--output_dir", str(work / "out")]
    assert main(["eval", "--model", f"local-dir:{other}", *COMMON, "--limit", "300", *out, "--cache_dir",
                 str(work / "cache")]) == 0
    code, _, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", "perturbed", *out], capsys)
    assert_refused(code, err, "names 2 models")
    assert err.strip().count("\n") == 0 and err.count("perturbed@perturbed@") == 2  # model@checkpoint, as typed
    experiments = []
    for candidate in (f"local-dir:{work / 'perturbed'}", f"local-dir:{other}"):
        code, text, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", candidate, *out,
                                   "--format", "json"], capsys)
        assert code == 0, (candidate, err)
        experiments.append({r["candidate_experiment"] for r in json.loads(text)})
    assert experiments[0].isdisjoint(experiments[1])


def test_compare_table_keeps_metric_names_whole_in_80_columns(work, capsys, monkeypatch):
    import sys

    retrieval_results(work)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, out, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", "perturbed",
                              "--output_dir", str(work / "retrieval")], capsys)
    assert code == 0, err
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)  # the terminal's styles
    assert max(len(line) for line in out.splitlines()) <= 80, out
    names = [f"{d}_retrieval_recall@{k}" for d in ("image", "text") for k in (1, 5, 10)]
    at = [out.index(name) for name in names]  # each whole, in reading order
    assert at == sorted(at) and "…" not in out


def test_a_pretrained_checkpoint_file_names_its_experiment(checkpoints, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Two checkpoint files of one open_clip architecture, both epoch_32.safetensors, each evaluated by its own
    `eval --pretrained FILE`: the file as typed (a relative path here) and ARCH@FILE name its experiment, found by
    the file's content; the architecture alone fits both and is refused with the two in one line."""
    from clipcache.flows.cli import main

    arch, files = checkpoints
    out = ["--output_dir", str(tmp_path / "out")]
    for file in files:
        assert main(["eval", "--model", ARCH, "--arch_config", str(arch), "--pretrained", str(file), *COMMON,
                     "--limit", "100", *out, "--cache_dir", str(tmp_path / "cache")]) == 0
    experiment_of = dict(connect(tmp_path / "out").execute(
        "SELECT DISTINCT checkpoint, experiment_id FROM metrics").fetchall())
    a, b = (experiment_of[f"sha256:{hashlib.sha256(f.read_bytes()).hexdigest()}"] for f in files)
    assert a != b
    import open_clip

    # as in a later process: the architecture eval registered from --arch_config is unknown to compare
    monkeypatch.delitem(open_clip.factory._MODEL_CONFIGS, ARCH)
    monkeypatch.chdir(tmp_path)
    typed = [str(f.relative_to(tmp_path)) for f in files]  # run_a/epoch_32.safetensors, as a user types it
    for baseline, candidate in ((typed[0], typed[1]), (f"{ARCH}@{files[1]}", f"{ARCH}@{typed[0]}")):
        code, text, err = run_cli(["compare", "--baseline", baseline, "--candidate", candidate, *out, "--format",
                                   "json"], capsys)
        assert code == 0, (baseline, candidate, err)
        pairs = {(r["baseline_experiment"], r["candidate_experiment"]) for r in json.loads(text)}
        assert pairs == ({(a, b)} if baseline == typed[0] else {(b, a)})
    code, _, err = run_cli(["compare", "--baseline", typed[0], "--candidate", ARCH, *out], capsys)
    assert_refused(code, err, f"{ARCH!r} names 2 models")
    assert err.strip().count("\n") == 0 and err.count(f"{ARCH}@epoch_32.safetensors@") == 2


def test_model_filters_keep_every_row_of_the_models_named():
    """keep_models (the --model filters): a model's name, model/pretrained as before, an experiment id keep all the
    rows of that model; a name that fits two models or none is refused in one line."""
    from clipcache.storage.errors import ConfigError
    from clipcache.tasks.report.selectors import keep_models

    def row(experiment, model, pretrained, checkpoint):
        return {"experiment_id": experiment, "model": model, "pretrained": pretrained, "checkpoint": checkpoint}

    rows = [row("aa11", "m", "x", "sha256:1"), row("aa12", "m", "x", "sha256:1"), row("bb21", "m", "y", "sha256:2"),
            row("cc31", "n", None, "random")]
    assert keep_models(rows, None) == rows
    assert keep_models(rows, ["m/x"]) == rows[:2] == keep_models(rows, ["m@x"]) == keep_models(rows, ["aa12"])
    assert keep_models(rows, ["n", "bb"]) == rows[2:]
    with pytest.raises(ConfigError, match=r"^'m' names 2 models: m@x; m@y \(give one as model@checkpoint") as e:
        keep_models(rows, ["m"])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^'aa1' is the start of 2 experiment ids: aa11, aa12"):
        keep_models(rows, ["aa1"])
    with pytest.raises(ConfigError, match=r"^--model 'o' names no model with results here \(models: m, n\)$"):
        keep_models(rows, ["o"])
