"""mieb:<task> against mteb itself: mteb's own ``evaluate`` with a reference encoder written here to mteb's model
protocol (open_clip's tiny bundled model loaded by open_clip, raw features as mteb's OpenCLIP wrapper returns them;
no clipcache code), and ``mieb:<task>`` through clipcache's cache on the same locally built copy, every score of
mteb's result within 1e-6; per task type: compositionality (image-text pair classification, whose evaluator hands
the encoder a dataset with ``features`` only) and the image-classification linear probe (mteb's seeds, 5
experiments), where the raw features must be the model's output to the last bit, fresh and cached."""

from __future__ import annotations

import copy
import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.tasks.datasets import shapes
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings

from mieb_fixtures import BATCH, BEIR_README, RETRIEVAL_README, session, write_configs, write_split

ASSET = Path(__file__).parents[1] / "tasks" / "models" / "assets" / "tiny-shapes-clip"


def reference_encoder():
    """An encoder to mteb's protocol around open_clip's own load of the bundled checkpoint: each batch's images and
    texts through open_clip's preprocess / tokenizer and ``encode_image`` / ``encode_text``, raw (not normalised),
    an image+text input the sum of both, as mteb's OpenCLIP wrapper does."""
    import open_clip
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{ASSET}", device="cpu")
    model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{ASSET}")

    class Reference(AbsEncoder):
        def __init__(self):
            self.mteb_model_meta = ModelMeta.create_empty(overwrites={
                "name": "reference/tiny-shapes-clip", "revision": "1", "modalities": ["text", "image"],
                "similarity_fn_name": ScoringFunction.COSINE})
            self.images_seen = 0

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            out = []
            with torch.inference_mode():
                for batch in inputs:
                    parts = []
                    if "image" in batch:
                        self.images_seen += len(batch["image"])
                        pixels = torch.stack([preprocess(image) for image in batch["image"]])
                        parts.append(model.encode_image(pixels).float())
                    if "text" in batch:
                        parts.append(model.encode_text(tokenizer(list(batch["text"]))).float())
                    out.append(sum(parts[1:], parts[0]).numpy())
            return np.concatenate(out)

    return Reference()


def write_parquet(root: Path, split: str, columns: dict, features: dict) -> None:
    from datasets import Dataset, Features

    write_split(root, split, Dataset.from_dict(columns, features=Features(features)))


def write_winoground_copy(root: Path, n: int = 12) -> Path:
    """facebook/winoground's columns (image_0, image_1, caption_0, caption_1): shapes images, each caption naming
    its image's class, so a good model gets most pairs right and a last-bit change could not hide."""
    from datasets import Image, Value

    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", 2 * n)
    names = [shapes.CLASSNAMES[int(x)] for x in ds.labels]
    write_parquet(root, "test", {
        "id": list(range(n)),
        "image_0": [ds.load_image(2 * i) for i in range(n)], "image_1": [ds.load_image(2 * i + 1) for i in range(n)],
        "caption_0": [f"a photo of a {names[2 * i]}." for i in range(n)],
        "caption_1": [f"a photo of a {names[2 * i + 1]}." for i in range(n)],
    }, {"id": Value("int64"), "image_0": Image(), "image_1": Image(), "caption_0": Value("string"),
        "caption_1": Value("string")})
    return root


def write_dtd_copy(root: Path) -> Path:
    """mteb/dtd's layout: data/{train,test}-*.parquet with columns image, label; 6 classes, 20 train images each
    (mteb draws 16 per label in each of its 5 experiments) and 36 test images."""
    from datasets import ClassLabel, Image

    def split(name: str, per_class: int) -> None:
        ds = shapes.load_shapes("fixture", "zeroshot_classification", name, 400)
        picked = [i for c in range(6) for i in np.flatnonzero(ds.labels == c)[:per_class]]
        write_parquet(root, name, {"image": [ds.load_image(int(i)) for i in picked],
                                   "label": [int(ds.labels[i]) for i in picked]},
                      {"image": Image(), "label": ClassLabel(names=list(shapes.CLASSNAMES[:6]))})

    split("train", 20)
    split("test", 6)
    return root


def write_cv_bench_copy(root: Path, n: int = 12) -> Path:
    """mteb/CV-Bench's columns (CVBenchCount keeps the rows of task "Count"): each question an image and a text,
    three choices of class names, the answer as "(A)".."(C)"; image + text queries rank the choice texts (mteb's
    any-to-any multiple choice: the raw image and text features summed)."""
    from datasets import Image, Sequence, Value

    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", n)
    names = [shapes.CLASSNAMES[int(x)] for x in ds.labels]
    choices = [[names[(i + 1) % n], names[(i + 5) % n]] for i in range(n)]
    for i, options in enumerate(choices):
        options.insert(i % 3, names[i])  # the right class at the answer's letter
    text = {"type": "2D", "filename": "x.png", "source": "shapes", "source_dataset": "shapes", "source_filename": "x",
            "target_class": "shape", "prompt": "p"}
    write_parquet(root, "test", {
        "idx": list(range(n)), **{k: [v] * n for k, v in text.items()}, "target_size": [[1, 1]] * n,
        "bbox": [[[0.0, 0.0, 1.0, 1.0]]] * n, "question": ["Which shape is in the picture?"] * n,
        "choices": choices, "answer": [f"({'ABC'[i % 3]})" for i in range(n)],
        "task": ["Count"] * (n - 2) + ["Depth"] * 2, "image": [ds.load_image(i) for i in range(n)],
    }, {"idx": Value("int64"), **{k: Value("string") for k in text}, "target_size": Sequence(Value("int64")),
        "bbox": Sequence(Sequence(Value("float64"))), "question": Value("string"),
        "choices": Sequence(Value("string")), "answer": Value("string"), "task": Value("string"), "image": Image()})
    return root


def write_voc_copy(root: Path) -> Path:
    """mteb/VOC2007's columns (image, classes: a list of label ids), train and test: each shapes image labelled
    with its colour and its shape (two labels of eleven), for VOC2007.v2's multilabel probe."""
    from datasets import Image, Sequence, Value

    n_shapes = len(shapes.CLASSNAMES) // len(shapes.COLOURS)
    for split, n in (("train", 90), ("test", 30)):
        ds = shapes.load_shapes("fixture", "zeroshot_classification", split, n)
        write_parquet(root, split, {"image": [ds.load_image(i) for i in range(n)], "classes": [
            [int(x) // n_shapes, len(shapes.COLOURS) + int(x) % n_shapes] for x in ds.labels]},
                      {"image": Image(), "classes": Sequence(Value("int64"))})
    return root


def write_rendered_sts17_copy(root: Path) -> Path:
    """Pixel-Linguist/rendered-sts17's layout: one config per language pair (README ``configs``), each
    ``<subset>/test-*.parquet`` with rendered sentence images and a gold score: what STS17MultilingualVisualSTS loads
    for each subset, and VisualSTS17Multilingual aggregates."""
    import mteb
    from datasets import Image, Value
    from test_visual_sts import render, sentence_pairs

    def png(colour: str, word: str) -> dict:
        buf = io.BytesIO()
        render(colour, word).save(buf, format="PNG")
        return {"bytes": buf.getvalue(), "path": None}

    subsets = list(mteb.get_task("STS17MultilingualVisualSTS").hf_subsets)
    configs = []
    for k, subset in enumerate(subsets):
        rows = sentence_pairs(6, seed=10 + k)
        write_parquet(root / subset, "test", {"sentence1": [png(*a) for a, _, _ in rows],
                                              "sentence2": [png(*b) for _, b, _ in rows],
                                              "score": [g for _, _, g in rows]},
                      {"sentence1": Image(), "sentence2": Image(), "score": Value("float64")})
        configs.append(f"- config_name: {subset}\n  data_files:\n  - split: test\n    path: {subset}/data/test-*.parquet\n")
    (root / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")
    return root


def write_vidore_copy(root: Path, n: int = 16) -> Path:
    """A ViDoRe BEIR-style snapshot (VidoreDocVQARetrieval: configs corpus (corpus-id, image), queries (query-id,
    query), qrels): the pages are shapes images, each query names one page's class (document understanding:
    text to image retrieval)."""
    from datasets import Dataset, Features, Image, Value

    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", n)
    parts = {
        "corpus": Dataset.from_dict({"corpus-id": list(range(n)), "image": [ds.load_image(i) for i in range(n)]},
                                    features=Features({"corpus-id": Value("int64"), "image": Image()})),
        "queries": Dataset.from_dict({"query-id": list(range(n)), "query": [
            f"a photo of a {shapes.CLASSNAMES[int(x)]}." for x in ds.labels]}),
        "qrels": Dataset.from_dict({"query-id": list(range(n)), "corpus-id": list(range(n)), "score": [1] * n}),
    }
    return write_configs(root, parts, BEIR_README)


def write_retrieval_copy(root: Path, query: tuple[str, ...], corpus: tuple[str, ...], n: int = 12) -> Path:
    """mteb's retrieval layout (configs corpus, queries and default, the qrels: tests/test_mieb_runner.py's README)
    with the given sides: query i is test image i and/or a text naming its class; its one relevant document is a
    train image of the same class and/or a caption naming it, among n documents."""
    from datasets import Dataset, Features, Image, Value

    test = shapes.load_shapes("fixture", "zeroshot_classification", "test", n)
    train = shapes.load_shapes("fixture", "zeroshot_classification", "train", 200)
    docs = [int(np.flatnonzero(train.labels == label)[0]) for label in test.labels]

    def side(prefix: str, columns: tuple[str, ...], images: list, texts: list[str]) -> Dataset:
        data, features = {"id": [f"{prefix}{i}" for i in range(n)]}, {"id": Value("string")}
        if "image" in columns:
            data["image"], features["image"] = images, Image()
        if "text" in columns:
            data["text"], features["text"] = texts, Value("string")
        return Dataset.from_dict(data, features=Features(features))

    names = [shapes.CLASSNAMES[int(x)] for x in test.labels]
    parts = {
        "queries": side("q", query, [test.load_image(i) for i in range(n)], [f"find a {c}" for c in names]),
        "corpus": side("d", corpus, [train.load_image(j) for j in docs], [f"a photo of a {c}." for c in names]),
        "default": Dataset.from_dict({"query-id": [f"q{i}" for i in range(n)], "corpus-id": [f"d{i}" for i in range(n)],
                                      "score": [1] * n}),
    }
    return write_configs(root, parts, RETRIEVAL_README)


def mteb_reference(name: str, root: Path):
    """mteb.evaluate on the local copy with the reference encoder: the task's scores of split test."""
    import mteb

    task = mteb.get_task(name)
    if task.is_aggregate:  # its tasks' copies, each pointed at the local copy
        parts = [copy.deepcopy(t) for t in task.metadata.tasks]
        for part in parts:
            part.metadata = part.metadata.model_copy(update={"dataset": {**part.metadata.dataset, "path": str(root)}})
        task.metadata = task.metadata.model_copy(update={"tasks": parts})
        task.tasks, task.taskname_to_task = parts, {p.metadata.name: p for p in parts}
    else:
        task.metadata = task.metadata.model_copy(update={"dataset": {**task.metadata.dataset, "path": str(root)}})
    encoder = reference_encoder()
    result = mteb.evaluate(encoder, task, cache=None, co2_tracker=False, show_progress_bar=False,
                           encode_kwargs={"batch_size": BATCH})
    [scores] = result.task_results[0].scores["test"]
    return scores


def assert_equal_scores(ours: dict[str, float], theirs: dict) -> None:
    numbers = {k: v for k, v in theirs.items() if v is None or isinstance(v, int | float)}
    assert {k.removeprefix("mteb_") for k in ours} == set(numbers) and len(numbers) >= 2  # an aggregate: 2
    for key, value in numbers.items():
        mine = ours[f"mteb_{key}"]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            assert math.isnan(mine), key
        else:
            assert mine == pytest.approx(value, abs=1e-6), key


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    from test_mieb_runner import write_cifar10_copy, write_flickr_i2t_copy
    from test_visual_sts import write_parquet as write_rendered_sts

    base = tmp_path_factory.mktemp("mieb-parity")
    return {"Winoground": write_winoground_copy(base / "winoground"), "DTD": write_dtd_copy(base / "dtd"),
            "CIFAR10ZeroShot": write_cifar10_copy(base / "cifar10"), "CIFAR10Clustering": base / "cifar10",
            "Flickr30kI2TRetrieval": write_flickr_i2t_copy(base / "flickr30ki2t"),
            "STS12VisualSTS": write_rendered_sts(base / "rendered-sts12"),
            "CVBenchCount": write_cv_bench_copy(base / "cv-bench"), "VidoreDocVQARetrieval": write_vidore_copy(
                base / "docvqa"), "VOC2007.v2": write_voc_copy(base / "voc2007"),
            "VisualSTS17Multilingual": write_rendered_sts17_copy(base / "rendered-sts17"),
            **{name: write_retrieval_copy(base / name, query, corpus) for name, query, corpus in RETRIEVAL_PAIRS}}


# any-to-any retrieval of the other modality pairs: (task, query columns, corpus columns)
RETRIEVAL_PAIRS = [("CUB200I2IRetrieval", ("image",), ("image",)), ("CIRRIT2IRetrieval", ("image", "text"), ("image",)),
                   ("OVENIT2ITRetrieval", ("image", "text"), ("image", "text")),
                   ("WebQAT2ITRetrieval", ("text",), ("image", "text")), ("WebQAT2TRetrieval", ("text",), ("text",))]


# one task per MIEB task type: compositionality, image classification (linear probe), zero-shot classification,
# clustering, any-to-any retrieval (image to text), visual STS, any-to-any multiple choice (vision-centric QA: image +
# text queries), document understanding (ViDoRe: text to page images), multilabel classification (VOC2007's probe),
# an aggregate (the mean of STS17MultilingualVisualSTS's main score over its eleven language pairs), and retrieval
# of every other modality pair MIEB has (i2i, it2i, it2it, t2it, t2t)
PARITY_TASKS = ["Winoground", "DTD", "CIFAR10ZeroShot", "CIFAR10Clustering", "Flickr30kI2TRetrieval", "STS12VisualSTS",
                "CVBenchCount", "VidoreDocVQARetrieval", "VOC2007.v2", "VisualSTS17Multilingual",
                *(name for name, _, _ in RETRIEVAL_PAIRS)]


@pytest.mark.parametrize("name", PARITY_TASKS)
def test_equal_to_mteb_with_a_reference_encoder_and_a_cached_rerun_loads_no_model(name, copies, tmp_path):
    theirs = mteb_reference(name, copies[name])
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    source = DataSource(f"mieb:{name}", str(copies[name]))
    scored = evaluate_one("mieb", model_session, source, store, memo, encode=EncodeSettings(BATCH, 0))
    assert_equal_scores(scored.metrics, theirs)
    assert 0 < scored.metrics["mteb_main_score"] <= 1  # not a degenerate set
    again, _ = session()
    rerun = evaluate_one("mieb", again, source, store, memo, encode=EncodeSettings(BATCH, 0))
    assert again.loads == 0
    assert rerun.metrics.keys() == scored.metrics.keys()
    assert all(math.isnan(v) and math.isnan(scored.metrics[k]) or v == scored.metrics[k]
               for k, v in rerun.metrics.items())


def test_the_probe_gets_the_models_raw_output_bit_for_bit_fresh_and_cached(copies, tmp_path):
    """What mteb's probe receives through the cache is the reference encoder's output itself (not row x norm),
    on the first run (encoded now) and on a rerun (read from the pool)."""
    import datasets
    import mteb
    from datasets import load_dataset

    from clipcache.tasks.encode.mteb_encoder import CachedMtebEncoder

    test = load_dataset(str(copies["DTD"]), split="test")
    images = [image.convert("RGB") for image in test["image"]]
    loader = torch.utils.data.DataLoader(datasets.Dataset.from_dict({"image": images}), batch_size=BATCH,
                                         collate_fn=lambda rows: {"image": [r["image"] for r in rows]})
    kw = {"task_metadata": mteb.get_task("DTD").metadata, "hf_split": "test", "hf_subset": "default"}
    expected = reference_encoder().encode(loader, **kw)
    model_session, _ = session()
    store = EmbeddingStore(tmp_path / "cache")
    fresh = CachedMtebEncoder(model_session, store, batch_size=BATCH).encode(loader, **kw)
    assert fresh.dtype == np.float32 and np.array_equal(fresh, expected)
    again, _ = session()
    cached = CachedMtebEncoder(again, store, batch_size=BATCH, cached_only=True).encode(loader, **kw)
    assert again.loads == 0 and np.array_equal(cached, expected)
    rows = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    norms = np.linalg.norm(expected, axis=1)
    # row x norm, what earlier releases handed mteb, is not the model's output
    assert not np.array_equal(rows.astype(np.float32) * norms[:, None].astype(np.float32), expected)


def test_the_mteb_export_files_each_result_under_the_split_and_subset_it_was_evaluated_on(tmp_path, capsys):
    """STSBenchmarkMultilingualVisualSTS evaluates dev and test (the table lists dev): a test result in German and
    a dev result in English are written under test/de and dev/en, and mteb reads both back as such."""
    from datetime import UTC, datetime

    import mteb

    from clipcache.storage.experiment import Experiment
    from clipcache.storage.results import new_run_id, write_metric_rows, write_run_row

    from hostile import run_cli

    out, when, name = tmp_path / "out", datetime(2026, 1, 1, tzinfo=UTC), "STSBenchmarkMultilingualVisualSTS"
    run_id = new_run_id()
    rows = []
    for split, language, value in (("test", "de", 0.25), ("dev", "en", 0.75)):
        experiment = Experiment(model="tiny-shapes-clip", checkpoint="tag:none", dataset=f"mieb:{name}", split=split,
                                language=language, task="mieb", sample_limit=None, default_prompts=True, prompts=None)
        rows.append({"run_id": run_id, "created_at": when, **experiment.columns(), "model_fingerprint": "f",
                     "metric": "mteb_main_score", "k": None, "value": value, "higher_is_better": True,
                     "n_samples": 10, "cache_keys": ["a"], "clipcache_version": "0.2.0"})
    write_metric_rows(out, run_id, rows)
    write_run_row(out, {"run_id": run_id, "created_at": when, "finished_at": when, "status": "completed",
                        "kind": "evaluate", "config": {"x": 1}, "versions": {}, "device": "cpu", "durations": {},
                        "clipcache_version": "0.2.0"})
    suite = tmp_path / "sts.yaml"
    suite.write_text("name: sts\ndatasets:\n" + "".join(
        f"  - dataset: \"mieb:{name}\"\n    task: mieb\n    main_metric: mteb_main_score\n    split: {split}\n"
        f"    language: {language}\n" for split, language in (("test", "de"), ("dev", "en"))))
    code, stdout, err = run_cli(["suite", "export", str(suite), "--format", "mteb", "--out", str(tmp_path / "mteb"),
                                 "--output_dir", str(out)], capsys)
    assert code == 0, err
    path = tmp_path / "mteb" / "results" / "tiny-shapes-clip" / "no_revision_available" / f"{name}.json"
    result = mteb.TaskResult.from_disk(path)
    filed = {(split, s["hf_subset"]): s["main_score"] for split, scores in result.scores.items() for s in scores}
    assert filed == {("test", "de"): 0.25, ("dev", "en"): 0.75}
    assert result.get_score(splits=["test"], languages=["deu"]) == 0.25
    assert result.get_score(splits=["dev"], languages=["eng"]) == 0.75
    loaded = mteb.ResultCache(tmp_path / "mteb").load_results(include_remote=False, validate_and_filter=True,
                                                              tasks=[name])
    [model] = loaded.model_results
    [back] = model.task_results
    got = {(split, s["hf_subset"]): s.get("main_score") for split, scores in back.scores.items() for s in scores}
    assert {k: v for k, v in got.items() if v is not None and v == v} == {("test", "de"): 0.25, ("dev", "en"): 0.75}


def test_the_docs_task_table_is_current_and_names_only_tasks_checked_here():
    """docs/mieb.md lists every task of mteb's four MIEB benchmarks as scripts/mieb_task_table.py writes it, and a
    kind marked checked there is one of this module's parity tests."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mieb_task_table", ASSET.parents[3] / "scripts" / "mieb_task_table.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert sorted(script.CHECKED.values()) == sorted(PARITY_TASKS)
    import mteb

    made_with = f"from mteb {mteb.__version__}:"
    if made_with not in script.PAGE.read_text(encoding="utf-8"):  # another mteb release lists other tasks
        pytest.skip(f"docs/mieb.md's table is not {made_with[:-1]}'s: run python scripts/mieb_task_table.py")
    assert script.main(["--check"]) == 0, "run: python scripts/mieb_task_table.py"
