"""`eval --suite` over a suite whose datasets differ in split or language: each dataset is evaluated with the suite's
own split and language, as the very experiment a plain `eval --dataset D --split S --language L` makes, so `suite
score` finds it; a --split or --language that contradicts the suite is refused in one line."""

from __future__ import annotations

import json

import pytest

from clipcache.flows.cli import main
from clipcache.flows.config.params import EvaluateParams, validate
from clipcache.flows.config.run_settings import Evaluation
from clipcache.storage.errors import ConfigError
from clipcache.storage.warehouse import connect

from conftest import write_wds
from hostile import assert_refused, run_cli

MODEL = ["--model", "tiny-shapes-clip", "--quiet", "--orchestrator", "local"]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One webdataset folder with a train (16 images) and a test (24 images) split, and a suite listing both."""
    tmp = tmp_path_factory.mktemp("mixed")
    root = tmp / "data"
    write_wds(root, "classification", 16, shards=1, split="train")
    write_wds(root, "classification", 24, shards=1, split="test")
    suite = tmp / "mixed.yaml"
    suite.write_text("name: mixed\ndatasets:\n"
                     "  - dataset: wds/mine\n    name: mine (train)\n    split: train\n    main_metric: acc1\n"
                     "  - dataset: wds/mine\n    name: mine (test)\n    main_metric: acc1\n")
    return tmp, root, suite


def _experiments(output_dir) -> dict[tuple[str, str], tuple[str, float, int]]:
    """(dataset, split) -> (experiment id, top-1 accuracy, samples) of the results under ``output_dir``."""
    rows = connect(output_dir).execute(
        "SELECT dataset, split, experiment_id, value, n_samples FROM metrics WHERE metric = 'acc' AND k = 1").fetchall()
    return {(dataset, split): (experiment, value, n) for dataset, split, experiment, value, n in rows}


def test_a_suite_that_mixes_splits_runs_each_dataset_with_its_own(mixed, capsys):
    tmp, root, suite = mixed
    cache = ["--cache_dir", str(tmp / "cache"), "--dataset_root", str(root)]
    assert main(["eval", "--suite", str(suite), *MODEL, *cache, "--output_dir", str(tmp / "suite")]) == 0
    table = capsys.readouterr().out
    assert "split" in table and "train" in table  # the results table tells the two splits of wds/mine apart
    for split in ("train", "test"):
        assert main(["eval", "--dataset", "wds/mine", "--split", split, *MODEL, *cache,
                     "--output_dir", str(tmp / "plain")]) == 0
    by_suite, plain = _experiments(tmp / "suite"), _experiments(tmp / "plain")
    assert set(by_suite) == {("wds/mine", "train"), ("wds/mine", "test")}
    assert by_suite == plain  # the same experiment ids, values and sample counts as the plain runs
    assert by_suite["wds/mine", "train"][2] == 16 and by_suite["wds/mine", "test"][2] == 24
    assert by_suite["wds/mine", "train"][0] != by_suite["wds/mine", "test"][0]

    code, out, _ = run_cli(["suite", "score", str(suite), "--output_dir", str(tmp / "suite"), "--format", "json",
                            "--bootstrap", "0"], capsys)
    assert code == 0
    (score,) = json.loads(out)
    expected = (by_suite["wds/mine", "train"][1] + by_suite["wds/mine", "test"][1]) / 2
    assert score["complete"] and score["score"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("flag, phrase", [
    (["--split", "test"], "split: suite mixed evaluates wds/mine with split train, not test; run it without --split"),
    (["--language", "jp"], "language: suite mixed evaluates wds/mine with language en, not ['jp']"),
])
def test_a_split_or_language_that_contradicts_the_suite_is_one_line(mixed, capsys, flag, phrase):
    tmp, root, suite = mixed
    code, _, err = run_cli(["eval", "--suite", str(suite), *MODEL, "--dataset_root", str(root), *flag,
                            "--output_dir", str(tmp / "refused"), "--cache_dir", str(tmp / "refused-cache")], capsys)
    assert_refused(code, err, phrase)
    assert not (tmp / "refused").exists() and not (tmp / "refused-cache").exists()


def test_shipped_suites_with_mixed_splits_and_languages_validate_with_each_datasets_own():
    """mieb_lite (TinyImageNetClustering on valid, the others on test) and internvl (imagenet1k and XTD in several
    languages) are validated, not run: their evaluations are the suite's entries, one each."""
    models = [{"model_name": "tiny-shapes-clip"}]
    mieb = validate(EvaluateParams, {"models": models, "suite": "mieb_lite"})
    evaluations = mieb.evaluations()
    assert len(evaluations) == len(mieb.datasets) == 51
    assert [e for e in evaluations if e.split != "test"] == [Evaluation("mieb:TinyImageNetClustering", "valid", "en")]
    assert mieb.run_settings(cached_only=False).evaluations == tuple(evaluations)
    # Prefect stores a run's parameters as dumped, and a run retried from them validates as the first did: no split
    # or language is in the dump of a suite run that was given none (they would contradict TinyImageNetClustering's)
    stored = json.loads(mieb.model_dump_json())
    assert "split" not in stored and "language" not in stored and validate(EvaluateParams, stored) == mieb
    assert json.loads(validate(EvaluateParams, {"models": models, "suite": "shapes", "split": "test"})
                      .model_dump_json())["split"] == "test"  # given: kept, and checked again
    beside = validate(EvaluateParams, {"models": models, "suite": "mieb_lite", "datasets": ["shapes"]}).evaluations()
    assert beside == [Evaluation("shapes", "test", "en"), *evaluations]  # --dataset beside --suite: --split's
    with pytest.raises(ConfigError, match="split: suite mieb_lite evaluates mieb:TinyImageNetClustering with split "
                                          "valid, not test"):
        validate(EvaluateParams, {"models": models, "suite": "mieb_lite", "split": "test"})
    internvl = validate(EvaluateParams, {"models": models, "suite": "internvl"})
    languages = {e.language for e in internvl.evaluations() if e.dataset == "imagenet1k"}
    assert languages == {"en", "cn", "jp", "ar", "it"}
    assert len(internvl.evaluations()) == 42 and len(internvl.datasets) == 29
    # a plain run: every dataset with --split and each --language, in that order
    plain = validate(EvaluateParams, {"models": models, "datasets": ["shapes", "shapes_retrieval"], "split": "train"})
    assert plain.evaluations() == [Evaluation("shapes", "train", "en"), Evaluation("shapes_retrieval", "train", "en")]
