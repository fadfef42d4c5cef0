"""How much of MIEB(lite) runs through ``mieb:<TaskName>`` on small locally built data: a copy of every ``mieb:`` task
of the ``mieb_lite`` suite in the hub layout its mteb task loads (shapes images and class names; the columns, splits,
categories and subsets read from mteb's task objects, and for the tasks whose class loads its data its own way,
that loader's layout: CV-Bench, ViDoRe, ImageCoDe, Hateful Memes, WIT, XM3600, M-BEIR), each run in-process through
the cache with the tiny model. Prints, per task, whether it ran (else mteb's or clipcache's message), its main score
and seconds, then the count. A coverage check, not a parity test (tests/test_mieb_parity.py compares with mteb).

    .venv/bin/python scripts/mieb_lite_local.py [--n 12] [--only TASK ...]

The suite's 7 clip_benchmark zero-shot datasets (cifar100, ...) are read by clipcache's own readers (torchvision
and webdataset layouts) and are not built here: scripts/mieb_lite_suite.py builds them and runs all 51 tasks through
the command line, suite score and the mteb export.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from clipcache.tasks.datasets import shapes  # noqa: E402

N_CLASSES = 6


def images(split: str, n: int) -> tuple[list[Any], list[int]]:
    """n shapes images of the first classes, as evenly spread as the pool allows (repeating it when n is large)."""
    ds = shapes.load_shapes("fixture", "zeroshot_classification", split, 400)
    picked = [int(i) for c in range(N_CLASSES) for i in np.flatnonzero(ds.labels == c)[: -(-n // N_CLASSES)]]
    picked = (picked * -(-n // len(picked)))[:n]
    return [ds.load_image(i) for i in picked], [int(ds.labels[i]) for i in picked]


def name_of(label: int) -> str:
    return shapes.CLASSNAMES[label]


def write(folder: Path, split: str, columns: dict[str, list], features: dict[str, Any]) -> None:
    from datasets import Dataset, Features

    folder.mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(columns, features=Features(features)).to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))


def png(colour: str, word: str) -> dict:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64), (245, 245, 245))
    ImageDraw.Draw(image).text((3, 20), f"a {colour} {word}", fill=shapes.COLOURS[colour])
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


def classification(task: Any, root: Path, n: int, splits: list[str]) -> None:
    from datasets import Image, Value

    for split in splits:
        imgs, labels = images(split if split in ("train", "test") else "test", n)
        write(root / "data", split, {task.input_column_name: imgs, task.label_column_name: labels},
              {task.input_column_name: Image(), task.label_column_name: Value("int64")})


def pair_classification(task: Any, root: Path, n: int) -> None:
    from datasets import Image, Value

    names = [task.images_column_names] if isinstance(task.images_column_names, str) else list(task.images_column_names)
    texts = [task.texts_column_names] if isinstance(task.texts_column_names, str) else list(task.texts_column_names)
    imgs, labels = images("test", n * len(names))
    columns: dict[str, list] = {c: imgs[k * n:(k + 1) * n] for k, c in enumerate(names)}
    columns.update({c: [f"a photo of a {name_of((labels[i] + k) % N_CLASSES)}." for i in range(n)]
                    for k, c in enumerate(texts)})
    write(root / "data", "test", columns, {**{c: Image() for c in names}, **{c: Value("string") for c in texts}})


def sts(task: Any, folder: Path, split: str, n: int) -> None:
    from datasets import Image, Value

    rng = np.random.default_rng(len(str(folder)))
    colours, words = list(shapes.COLOURS), list(shapes.SHAPES)
    rows = [(colours[rng.integers(6)], words[rng.integers(5)], colours[rng.integers(6)], words[rng.integers(5)])
            for _ in range(n)]
    first, second = task.column_names
    write(folder, split, {first: [png(a, b) for a, b, _, _ in rows], second: [png(c, d) for _, _, c, d in rows],
                          "score": [2.5 * (a == c) + 2.5 * (b == d) for a, b, c, d in rows]},
          {first: Image(), second: Image(), "score": Value("float64")})


def sts_task(task: Any, root: Path, n: int, splits: list[str]) -> None:
    subsets = list(task.hf_subsets)
    if subsets == ["default"]:
        for split in splits:
            sts(task, root / "data", split, n)
        return
    configs = []
    for subset in subsets:
        for split in splits:
            sts(task, root / subset, split, n)
        files = "".join(f"  - split: {s}\n    path: {subset}/{s}-*.parquet\n" for s in splits)
        configs.append(f"- config_name: {subset}\n  data_files:\n{files}")
    (root / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")


def retrieval(task: Any, root: Path, n: int, both: bool = False) -> None:
    """Generic retrieval configs (corpus, queries, default) with the category's modalities on each side; ``both``:
    every side has an image and a text column, the other modality's a placeholder (M-BEIR's layout, whose tasks
    drop the column they do not use)."""
    from datasets import Dataset, Features, Image, Value

    query, corpus = task.metadata.category.split("2")
    test_imgs, labels = images("test", n)
    train_imgs, _ = images("train", 60)
    train_labels = images("train", 60)[1]
    docs = [train_imgs[train_labels.index(label)] for label in labels]

    def side(prefix: str, kinds: str, imgs: list, texts: list[str]) -> Dataset:
        data, features = {"id": [f"{prefix}{i}" for i in range(n)]}, {"id": Value("string")}
        if "i" in kinds or both:
            data["image"], features["image"] = imgs if "i" in kinds else [imgs[0]] * n, Image()
        if "t" in kinds or both:
            data["text"], features["text"] = texts if "t" in kinds else [""] * n, Value("string")
        return Dataset.from_dict(data, features=Features(features))

    names = [name_of(x) for x in labels]
    parts = {"queries": side("q", query, test_imgs, [f"find a {c}" for c in names]),
             "corpus": side("d", corpus, docs, [f"a photo of a {c}." for c in names]),
             "default": Dataset.from_dict({"query-id": [f"q{i}" for i in range(n)],
                                           "corpus-id": [f"d{i}" for i in range(n)], "score": [1] * n})}
    configs = []
    for name, part in parts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        part.to_parquet(str(root / name / "test-00000-of-00001.parquet"))
        configs.append(f"- config_name: {name}\n  data_files:\n  - split: test\n    path: {name}/test-*.parquet\n")
    (root / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")


def vidore(root: Path, n: int) -> None:
    from datasets import Dataset, Features, Image, Value

    imgs, labels = images("test", n)
    parts = {"corpus": Dataset.from_dict({"corpus-id": list(range(n)), "image": imgs},
                                         features=Features({"corpus-id": Value("int64"), "image": Image()})),
             "queries": Dataset.from_dict({"query-id": list(range(n)),
                                           "query": [f"a photo of a {name_of(x)}." for x in labels]}),
             "qrels": Dataset.from_dict({"query-id": list(range(n)), "corpus-id": list(range(n)), "score": [1] * n})}
    configs = []
    for name, part in parts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        part.to_parquet(str(root / name / "test-00000-of-00001.parquet"))
        configs.append(f"- config_name: {name}\n  data_files:\n  - split: test\n    path: {name}/test-*.parquet\n")
    (root / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")


def cv_bench(root: Path, subtask: str, n: int) -> None:
    from datasets import Image, Sequence, Value

    imgs, labels = images("test", n)
    names = [name_of(x) for x in labels]
    choices = [[name_of((x + 1) % N_CLASSES), name_of((x + 2) % N_CLASSES)] for x in labels]
    for i, options in enumerate(choices):
        options.insert(i % 3, names[i])
    text = ("type", "filename", "source", "source_dataset", "source_filename", "target_class", "prompt")
    write(root / "data", "test", {
        "idx": list(range(n)), **{k: ["x"] * n for k in text}, "target_size": [[1, 1]] * n,
        "bbox": [[[0.0, 0.0, 1.0, 1.0]]] * n, "question": ["Which shape is in the picture?"] * n, "choices": choices,
        "answer": [f"({'ABC'[i % 3]})" for i in range(n)], "task": [subtask] * n, "image": imgs,
    }, {"idx": Value("int64"), **{k: Value("string") for k in text}, "target_size": Sequence(Value("int64")),
        "bbox": Sequence(Sequence(Value("float64"))), "question": Value("string"),
        "choices": Sequence(Value("string")), "answer": Value("string"), "task": Value("string"), "image": Image()})


def image_code(root: Path, n: int) -> None:
    """mteb/imagecode-multi's configs: corpus (split corpus: id, image), query (id, text) and qrels, ten candidate
    images a query, the first one right."""
    from datasets import Dataset, Features, Image, Value

    imgs, labels = images("test", 10 * n)
    parts = {("corpus", "corpus"): Dataset.from_dict({"id": [f"c{j}" for j in range(10 * n)], "image": imgs},
                                                     features=Features({"id": Value("string"), "image": Image()})),
             ("query", "test"): Dataset.from_dict({"id": [f"q{i}" for i in range(n)], "text": [
                 f"a photo of a {name_of(labels[10 * i])}." for i in range(n)]}),
             ("qrels", "test"): Dataset.from_dict({"query-id": [f"q{i}" for i in range(n) for _ in range(10)],
                                                   "corpus-id": [f"c{j}" for j in range(10 * n)],
                                                   "score": [int(j % 10 == 0) for j in range(10 * n)]})}
    configs = []
    for (name, split), part in parts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        part.to_parquet(str(root / name / f"{split}-00000-of-00001.parquet"))
        configs.append(f"- config_name: {name}\n  data_files:\n  - split: {split}\n    path: {name}/{split}-*.parquet\n")
    (root / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")


def captions_by_language(task: Any, root: Path, n: int, extra: tuple[str, ...]) -> None:
    """mteb/xm3600's and mteb/wit's layout: one split per language (data/<lang>-*.parquet: image_id, image,
    captions, and the columns the task drops), each image's captions naming its class."""
    from datasets import Image, Sequence, Value

    imgs, labels = images("test", n)
    for lang in task.hf_subsets:
        write(root / "data", lang, {"image_id": [f"i{i}" for i in range(n)], "image": imgs,
                                    "captions": [[f"a photo of a {name_of(x)}."] for x in labels],
                                    **{c: [[""]] * n for c in extra if c.startswith("captions")},
                                    **{c: [""] * n for c in extra if not c.startswith("captions")}},
              {"image_id": Value("string"), "image": Image(), "captions": Sequence(Value("string")),
               **{c: Sequence(Value("string")) for c in extra if c.startswith("captions")},
               **{c: Value("string") for c in extra if not c.startswith("captions")}})


def hateful_memes(root: Path, n: int) -> None:
    """mteb/MMSoc_HatefulMemes's splits test, validation and train (id, text, image, split, label): every split's
    texts are the corpus, each test image's own text the relevant one."""
    from datasets import Image, Value

    for k, split in enumerate(("test", "validation", "train")):
        imgs, labels = images(split if split != "validation" else "train", n)
        ids = [k * 1000 + i for i in range(n)]
        write(root / "data", split, {"id": ids, "text": [f"a photo of a {name_of(x)}, number {i}." for i, x in
                                                           zip(ids, labels, strict=True)],
                                     "image": imgs, "split": [split] * n, "label": [0] * n},
              {"id": Value("int64"), "text": Value("string"), "image": Image(), "split": Value("string"),
               "label": Value("int64")})


def build(task: Any, root: Path, n: int) -> None:
    """The task's local copy, by its kind (an aggregate: each task it aggregates under root/<its name>)."""
    base = next(c.__name__ for c in type(task).__mro__ if c.__name__.startswith("AbsTask"))
    name = task.metadata.name
    if base == "AbsTaskAggregate":
        for part in task.metadata.tasks:
            build(copy.deepcopy(part), root / part.metadata.name, n)
    elif base == "AbsTaskClassification":
        classification(task, root, n * 3, [task.train_split, *task.metadata.eval_splits])
    elif base in ("AbsTaskClusteringLegacy", "AbsTaskZeroShotClassification", "AbsTaskMultilabelClassification"):
        classification(task, root, n * 2, list(task.metadata.eval_splits))
    elif name == "XM3600T2IRetrieval":
        captions_by_language(task, root, n, ("captions_tokenized", "captions_tokenized_lowercase", "image_locale"))
    elif name == "WITT2IRetrieval":
        captions_by_language(task, root, n, ())
    elif name == "HatefulMemesI2TRetrieval":
        hateful_memes(root, n)
    elif name == "ImageCoDe":
        image_code(root, n)
    elif base == "AbsTaskImageTextPairClassification":
        pair_classification(task, root, n)
    elif base == "AbsTaskSTS":
        sts_task(task, root, n, list(task.metadata.eval_splits))
    elif name.startswith("CVBench"):
        cv_bench(root, name.removeprefix("CVBench"), n)
    elif name.startswith("Vidore"):
        vidore(root, n)
    elif base == "AbsTaskRetrieval":
        retrieval(task, root, n, both=any("dataset_transform" in c.__dict__ for c in type(task).__mro__
                                          if not c.__name__.startswith("AbsTask")))
    else:
        raise ValueError(f"{name}: this script builds no local layout for mteb tasks of type {base}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=12, help="samples per split (classification: 3x for train)")
    parser.add_argument("--only", nargs="*", help="these mteb task names only")
    args = parser.parse_args()

    import mteb
    import torch

    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.encode.stage import ModelSession
    from clipcache.tasks.evaluation import evaluate_one
    from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec
    from clipcache.tasks.suites import load_suite

    torch.set_num_threads(2)
    suite = load_suite("mieb_lite")
    entries = [e for e in suite.datasets if e.dataset.startswith("mieb:")]
    elsewhere = len(suite.datasets) - len(entries)
    if args.only:
        entries = [e for e in entries if e.dataset.removeprefix("mieb:") in args.only]
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    ran, failed = 0, []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mieb-lite-") as tmp:
        store = EmbeddingStore(Path(tmp) / "cache")
        for entry in entries:
            name = entry.dataset.removeprefix("mieb:")
            root = Path(tmp) / "data" / name
            t0 = time.perf_counter()
            try:
                build(mteb.get_task(name), root, args.n)
                scored = evaluate_one("mieb", session, DataSource(entry.dataset, str(root), split=entry.split,
                                                                  language=entry.language),
                                      store, memo, encode=EncodeSettings(32, 0))
                score = scored.metrics["mteb_main_score"]
                ran += 1
                print(f"ran     {name:34s} main {score:.4f}  {time.perf_counter() - t0:5.1f} s", flush=True)
            except Exception as e:  # a report, not a test: every task's outcome is printed
                message = str(e).strip().splitlines()[0][:150] if str(e).strip() else ""
                failed.append(name)
                print(f"FAILED  {name:34s} {type(e).__name__}: {message}", flush=True)
    print(f"\n{ran} of {len(entries)} mieb: tasks of mieb_lite ran on locally built data "
          f"(the suite's {elsewhere} clip_benchmark datasets not built); {time.perf_counter() - started:.0f} s")
    if failed:
        print("failed: " + ", ".join(failed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
