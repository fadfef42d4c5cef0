"""Hostile names and patterns: every path built from a name stays inside its folder, no experiment's file replaces
another's, templates hold plain fields only, and inputs a run would ignore are refused (issue #25)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from clipcache.storage.experiment import Experiment
from clipcache.storage.naming import MAX_COMPONENT, path_component, template_problem

from conftest import REPO, TINY_MODEL, write_image_queries, write_wds
from hostile import Tree, assert_refused, run_cli

pytestmark = pytest.mark.hostile

HOSTILE_NAMES = ["..", ".", "/", "\\", "x/..", "../../etc", "/etc/passwd", "a\x00b", ".hidden", "~", "",
                 "C:\\Windows\\x", "a" * 600, "名前/../x", "foo bar", "foo_bar", "foo/bar", "foo:bar", "\n"]
BASE = ["--model", "tiny-shapes-clip", "--quiet", "--orchestrator", "local"]


# -- names as path components ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_name_is_one_component_inside_its_folder(name, tmp_path):
    part = path_component(name)
    assert part not in ("", ".", "..") and not part.startswith(".")
    assert "/" not in part and "\\" not in part and "\x00" not in part and "\n" not in part
    assert len(part.encode()) <= 3 * MAX_COMPONENT + 9
    assert (tmp_path / part).resolve().parent == tmp_path.resolve()


def test_names_that_clean_alike_get_different_components():
    parts = [path_component(n) for n in HOSTILE_NAMES]
    assert len(set(parts)) == len(parts), parts
    assert path_component("shapes") == "shapes" and path_component("tiny-shapes-clip") == "tiny-shapes-clip"
    assert path_component("describer", identity="orgA/describer") != path_component("describer",
                                                                                     identity="orgB/describer")


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_result_paths_stay_inside_output_dir(name, tmp_path):
    exp = Experiment(model=name or "m", checkpoint="tag:x", dataset=name or "d", split="test", language=name or "en",
                     task="zeroshot_classification", pretrained=name or None, model_dir=name)
    for path in (exp.result_path(tmp_path), exp.alternate_result_path(tmp_path)):
        assert path.resolve().is_relative_to(tmp_path.resolve()), path
        assert len(path.relative_to(tmp_path).parts) <= 3 and all(len(p) < 255 for p in path.parts)


@pytest.mark.parametrize("template,fields,bad", [
    ("a photo of a {c}.", ("c",), None), ("{{c}} {c}", ("c",), None),
    ("a {c} of {kind}", ("c",), "unknown field {kind}"), ("{0} and {c}", ("c",), "positional field {0}"),
    ("{} {c}", ("c",), "positional field {}"), ("{c.upper}", ("c",), "no attribute or index access"),
    ("{c[0]}", ("c",), "no attribute or index access"), ("{c!r}", ("c",), "only plain {name}"),
    ("{c:>99999999}", ("c",), "only plain {name}"), ("{c", ("c",), "not a valid template"),
    ("res_{model.upper}.json", ("model",), "no attribute or index access")])
def test_template_fields(template, fields, bad):
    problem = template_problem(template, fields)
    assert (problem is None) if bad is None else (bad in problem), problem


# -- eval: patterns and prompt files are checked before any work ----------------------------------------------------
@pytest.mark.parametrize("pattern,phrase", [
    ("res_{model.upper}.json", "no attribute or index access"), ("res_{model.nope}.json", "{model.nope}"),
    ("{0}.json", "positional field {0}"), ("{dataset}_{kind}.json", "unknown field {kind}"),
    ("{dataset[0]}.json", "no attribute or index access")])
def test_output_pattern_is_refused_before_any_work(pattern, phrase, tmp_path, capsys):
    code, _, err = run_cli(["eval", *BASE, "--dataset", "shapes", "--limit", "8", "--output", str(tmp_path / pattern),
                            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")], capsys)
    assert_refused(code, err, phrase)
    assert "output" in err
    assert not (tmp_path / "cache" / "embeddings").exists()  # nothing was encoded
    assert not list(tmp_path.glob("res_*"))


def test_output_pattern_values_are_single_components(tmp_path, capsys):
    """clip_benchmark's pattern decides the folders; a field's value never adds one."""
    pattern = str(tmp_path / "cb" / "{dataset}__{model}__{pretrained_full_path}.json")
    root = write_wds(tmp_path / "data" / "a..b", "classification", 8, shards=1, n_classes=4)
    code, _, err = run_cli(["eval", *BASE, "--dataset", "wds/a..b", "--dataset_root", str(root), "--output", pattern,
                            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")], capsys)
    assert code == 0, err
    [written] = (tmp_path / "cb").iterdir()
    assert written.name.startswith("a..b__tiny-shapes-clip__") and written.parent == tmp_path / "cb"


@pytest.mark.parametrize("templates,phrase", [("a {c} of {kind}", "unknown field {kind}"),
                                              ("{0} is a {c}", "positional field {0}"),
                                              ("a {c.__class__}", "no attribute or index access")])
def test_class_templates_with_foreign_fields_are_one_line(templates, phrase, tmp_path, capsys):
    path = tmp_path / "templates.txt"
    path.write_text(f"a photo of a {{c}}.\n{templates}\n")
    code, _, err = run_cli(["eval", *BASE, "--dataset", "shapes", "--limit", "8", "--templates", str(path),
                            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")], capsys)
    assert_refused(code, err, phrase)
    assert str(path) in err and not (tmp_path / "out" / "tiny-shapes-clip").exists()


def test_a_dataset_template_file_with_foreign_fields_is_one_line(tmp_path, capsys):
    root = write_wds(tmp_path / "wds", "classification", 8, shards=1, n_classes=4)
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\na {c} of {kind}\n")
    code, _, err = run_cli(["eval", *BASE, "--dataset", "wds/mine", "--dataset_root", str(root),
                            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")], capsys)
    assert_refused(code, err, "unknown field {kind}")
    assert "zeroshot_classification_templates.txt" in err


@pytest.mark.parametrize("argv,phrase", [
    (["--dataset", "shapes", "--split", "../../x"], "split: '../../x' is not a plain name"),
    (["--dataset", "shapes", "--split", "/etc"], "is not a plain name"),
    (["--dataset", "wds/a\x00b"], "holds a control character"),
    (["--dataset", "shapes", "--annotation_file", "captions.json"], "does not read an annotation file"),
])
def test_names_and_unused_inputs_are_refused_before_any_work(argv, phrase, tmp_path, capsys):
    code, _, err = run_cli(["eval", *BASE, *argv, "--output_dir", str(tmp_path / "out"),
                            "--cache_dir", str(tmp_path / "cache")], capsys)
    assert_refused(code, err, phrase)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_a_model_name_with_nul_is_refused(tmp_path, capsys):
    code, _, err = run_cli(["eval", "--model", "tiny\x00x", "--dataset", "shapes", "--quiet", "--output_dir",
                            str(tmp_path / "out")], capsys)
    assert_refused(code, err, "holds a control character")


@pytest.mark.parametrize("content,datasets,phrase", [
    ({"cifar10": ["a", "b"]}, ["shapes"], "none of which is a dataset of this run"),
    (["circle", "square"], ["shapes_retrieval"], "would be ignored: no dataset of this run"),
])
def test_classnames_the_run_cannot_use_are_refused(content, datasets, phrase, tmp_path, capsys):
    path = tmp_path / "names.json"
    path.write_text(json.dumps(content))
    code, _, err = run_cli(["eval", *BASE, "--dataset", *datasets, "--limit", "8", "--classnames", str(path),
                            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")], capsys)
    assert_refused(code, err, phrase)
    assert not (tmp_path / "cache" / "embeddings").exists()


# -- eval: one experiment's files never replace another's ----------------------------------------------------------
def test_dataset_names_that_clean_alike_keep_their_own_result_files(tmp_path, capsys):
    data = tmp_path / "data"
    write_wds(data / "foo bar", "classification", 8, shards=1, n_classes=4, seed=0)
    write_wds(data / "foo_bar", "classification", 12, shards=1, n_classes=4, seed=1)
    common = ["--dataset_root", str(data / "{dataset}"), "--output_dir", str(tmp_path / "out"),
              "--cache_dir", str(tmp_path / "cache")]
    assert run_cli(["eval", *BASE, "--dataset", "wds/foo bar", *common], capsys)[0] == 0
    before = Tree(tmp_path / "out" / "tiny-shapes-clip")
    assert run_cli(["eval", *BASE, "--dataset", "wds/foo_bar", *common], capsys)[0] == 0
    before.assert_unchanged(*before.files)
    results = [json.loads(p.read_text()) for p in (tmp_path / "out" / "tiny-shapes-clip").glob("*.json")]
    assert sorted(r["dataset"] for r in results) == ["wds/foo bar", "wds/foo_bar"]


def test_models_sharing_a_folder_name_keep_their_own_result_files(tmp_path, capsys):
    """evalscope's layout names the folder after the model's last path component: two models called 'tiny' in
    different folders (different weights) share it, and the second gets a file of its own."""
    a, b = tmp_path / "orgA" / "tiny", tmp_path / "orgB" / "tiny"
    shutil.copytree(TINY_MODEL, a)
    shutil.copytree(TINY_MODEL, b)
    (b / "NOTES.txt").write_text("another checkpoint\n")  # other folder content: another checkpoint identity
    common = ["--dataset", "shapes", "--limit", "8", "--quiet", "--orchestrator", "local", "--output_dir",
              str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    assert run_cli(["eval", "--model", f"local-dir:{a}", *common], capsys)[0] == 0
    [first] = (tmp_path / "out").rglob("shapes_*.json")
    before = Tree(tmp_path / "out")
    code, _, err = run_cli(["eval", "--model", f"local-dir:{b}", *common], capsys)
    assert code == 0, err
    before.assert_unchanged(first)
    files = sorted((tmp_path / "out").rglob("shapes_*.json"))
    assert len(files) == 2 and len({json.loads(f.read_text())["experiment_id"] for f in files}) == 2
    # --skip_existing finds each experiment's own file again
    for model in (a, b):
        code, out, _ = run_cli(["eval", "--model", f"local-dir:{model}", *common, "--skip_existing"], capsys)
        assert code == 0 and "skipped" in out


# -- convert: captioning model names ------------------------------------------------------------------------------
@pytest.fixture
def vlm():
    sys.path.insert(0, str(REPO / "scripts"))
    from fake_vlm_server import FakeVLMServer

    with FakeVLMServer() as server:
        yield server


def convert_config(tmp_path: Path, api_base: str, model_names: list[str], **extra) -> Path:
    data = write_image_queries(tmp_path / "d", n=3)
    cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": m, "api_base": api_base, "max_retries": 1} for m in model_names],
        "dataset_name": ["custom"], "data_dir": str(data), "task": "image_caption", "verbose": False,
        "output_dir": str(tmp_path / "work" / "out"), "cache_dir": str(tmp_path / "work" / "cache"), **extra}}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("model_name", ["..", "x/..", "/", "../../escape", "/abs/olute", "a\\..\\b"])
def test_convert_model_names_never_leave_output_dir(model_name, vlm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cfg = convert_config(tmp_path, vlm.api_base, [model_name])
    tree = Tree(tmp_path)
    code, _, err = run_cli(["run", str(cfg)], capsys)
    assert code == 0, err
    tree.assert_writes_only_under(tmp_path / "work" / "out", tmp_path / "work" / "cache")
    [result] = (tmp_path / "work" / "out").glob("*/custom_image_caption.json")
    assert result.parent.parent == tmp_path / "work" / "out"
    assert (result.parent / "custom" / "retrieval_data" / "corpus.jsonl").is_file()


def test_convert_models_with_the_same_basename_keep_their_own_folders(vlm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cfg = convert_config(tmp_path, vlm.api_base, ["orgA/describer"])
    assert run_cli(["run", str(cfg)], capsys)[0] == 0
    out = tmp_path / "work" / "out"
    [first] = list(out.iterdir())
    before = Tree(out)
    cfg = convert_config(tmp_path, vlm.api_base, ["orgB/describer"])
    assert run_cli(["run", str(cfg)], capsys)[0] == 0
    before.assert_unchanged(first)
    folders = sorted(p.name for p in out.iterdir())
    assert len(folders) == 2 and all(f.startswith("describer-") for f in folders)
    models = {json.loads(p.read_text())["model"] for p in out.glob("*/custom_image_caption.json")}
    assert models == {"orgA/describer", "orgB/describer"}


def test_skip_existing_converts_a_damaged_beir_folder_again(vlm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cfg = convert_config(tmp_path, vlm.api_base, ["captioner"], skip_existing=True)
    assert run_cli(["run", str(cfg)], capsys)[0] == 0
    folder = tmp_path / "work" / "out" / "captioner" / "custom" / "retrieval_data"
    good = (folder / "corpus.jsonl").read_text()
    code, out, _ = run_cli(["run", str(cfg)], capsys)
    assert code == 0 and "skipped" in out  # intact: skipped
    (folder / "corpus.jsonl").write_text(good.splitlines()[0] + "\n")  # damaged: a document lost
    code, out, err = run_cli(["run", str(cfg)], capsys)
    assert code == 0 and "skipped" not in out, out + err
    assert (folder / "corpus.jsonl").read_text() == good
    (folder / "queries.jsonl").unlink()  # damaged: a file lost
    code, out, _ = run_cli(["run", str(cfg)], capsys)
    assert code == 0 and "skipped" not in out and (folder / "queries.jsonl").is_file()


@pytest.mark.parametrize("split", ["../../x", "a/b", ""])
def test_convert_split_names_are_plain(split, vlm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cfg = convert_config(tmp_path, vlm.api_base, ["captioner"], split=split)
    code, _, err = run_cli(["run", str(cfg)], capsys)
    assert_refused(code, err, "split")
    assert not (tmp_path / "work").exists()


def test_an_output_pattern_shared_by_two_datasets_keeps_both_files(tmp_path, capsys):
    pattern = str(tmp_path / "cb" / "{model}.json")  # names no dataset: both datasets map to one file
    code, _, err = run_cli(["eval", *BASE, "--dataset", "shapes", "shapes_retrieval", "--limit", "8", "--output",
                            pattern, "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")],
                           capsys)
    assert code == 0, err
    files = sorted((tmp_path / "cb").iterdir())
    assert len(files) == 2 and "tiny-shapes-clip.json" in {f.name for f in files}
    assert {json.loads(f.read_text())["dataset"] for f in files} == {"shapes", "shapes_retrieval"}
