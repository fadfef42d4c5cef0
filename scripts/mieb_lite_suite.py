"""The whole ``mieb_lite`` suite through the command line on small locally built data: every one of its 51 tasks
built under ``<tmp>/data/<dataset>`` (a ``mieb:`` task's: its mteb name) (the 44 ``mieb:`` tasks by scripts/mieb_lite_local.py's builders, the 7
clip_benchmark zero-shot sets here), then, with the bundled tiny-shapes-clip model,

    clipcache eval --suite mieb_lite --dataset_root '<tmp>/data/{dataset}'
                                 (one run: each dataset with its own task and the suite's split, valid or test)
    clipcache suite score mieb_lite                                            (must be complete: 51 of 51)
    clipcache suite export mieb_lite --format mteb --out <tmp>/mteb

and the exported folder read back with mteb's ``TaskResult.from_disk`` (every file) and ``ResultCache`` (with
``validate_and_filter=True``): every task the suite names has a file whose scores hold the split (and subsets) its
warehouse result was evaluated on, with clipcache's value as mteb's main score. Prints a summary; exit 1 on any gap.

    .venv/bin/python scripts/mieb_lite_suite.py [--n 8] [--keep DIR]

The clip_benchmark sets are written in the layouts clipcache reads for their names: CIFAR-100, Food-101 and
Oxford-IIIT Pet in torchvision's original files (the names clipcache reads only that way), Country211, FER2013,
FGVC Aircraft and Stanford Cars as clip_benchmark webdataset shards. Images are shapes images; the class names are
the datasets' real ones where the repo's clip_benchmark prompts carry them (Country211, FER2013, Oxford-IIIT Pet),
shapes class names elsewhere (their real lists come from the datasets' own files, not shipped here).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import numpy as np  # noqa: E402
from mieb_lite_local import N_CLASSES, build, images  # noqa: E402

from clipcache.tasks.datasets import shapes  # noqa: E402

PROMPTS = REPO / "tasks" / "datasets" / "clip_benchmark" / "prompts" / "clip_benchmark.json"


def real_classnames(dataset: str) -> list[str] | None:
    return json.loads(PROMPTS.read_text(encoding="utf-8"))["en"]["classnames"].get(dataset)


def wds_set(root: Path, dataset: str, n: int) -> None:
    """clip_benchmark's webdataset layout: test/0.tar (png + cls), nshards.txt, classnames.txt, templates."""
    import webdataset as wds

    names = real_classnames(dataset) or list(shapes.CLASSNAMES[:N_CLASSES])
    imgs, labels = images("test", n)
    (root / "test").mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(root / "test" / "0.tar")) as sink:
        for i, (image, label) in enumerate(zip(imgs, labels, strict=True)):
            buf = io.BytesIO()
            image.save(buf, format="PNG")
            sink.write({"__key__": f"s{i:06d}", "png": buf.getvalue(), "cls": str(label % len(names))})
    (root / "test" / "nshards.txt").write_text("1\n")
    (root / "classnames.txt").write_text("\n".join(names) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("\n".join(shapes.TEMPLATES) + "\n")


def cifar100(root: Path, n: int) -> None:
    """torchvision's cifar-100-python: pickled dicts written here (clipcache reads them with its safe unpickler)."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("test", "train"):
        imgs, labels = images(split, n)
        rows = np.stack([np.asarray(im.convert("RGB").resize((32, 32))).transpose(2, 0, 1).reshape(-1)
                         for im in imgs]).astype(np.uint8)
        (folder / split).write_bytes(pickle.dumps({"data": rows, "fine_labels": labels}))
    names = list(shapes.CLASSNAMES[:N_CLASSES]) + [f"class {i}" for i in range(N_CLASSES, 100)]
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": names, "coarse_label_names": ["all"]}))


def food101(root: Path, n: int) -> None:
    """food-101/: images/<class>/<id>.jpg, meta/{train,test}.json and .txt, classes.txt, labels.txt."""
    base = root / "food-101"
    classes = [c.replace(" ", "_") for c in shapes.CLASSNAMES[:N_CLASSES]]
    for split in ("train", "test"):
        imgs, labels = images(split, n)
        meta: dict[str, list[str]] = {c: [] for c in classes}
        for i, (image, label) in enumerate(zip(imgs, labels, strict=True)):
            path = f"{classes[label]}/{split}{i}"
            (base / "images" / classes[label]).mkdir(parents=True, exist_ok=True)
            image.convert("RGB").save(base / "images" / f"{path}.jpg", quality=95)
            meta[classes[label]].append(path)
        (base / "meta").mkdir(parents=True, exist_ok=True)
        (base / "meta" / f"{split}.json").write_text(json.dumps(meta))
        (base / "meta" / f"{split}.txt").write_text("".join(f"{p}\n" for ps in meta.values() for p in ps))
    (base / "meta" / "classes.txt").write_text("".join(f"{c}\n" for c in classes))
    (base / "meta" / "labels.txt").write_text("".join(f"{c.replace('_', ' ')}\n" for c in classes))


def pets(root: Path, n: int) -> None:
    """oxford-iiit-pet/: images/<Breed>_<k>.jpg, annotations/{trainval,test}.txt and list.txt; the first breeds of
    the real 37 (cats' file names capitalised, dogs' lower case, as the real files)."""
    base = root / "oxford-iiit-pet"
    breeds = (real_classnames("pets") or [])[:N_CLASSES]
    listing: list[str] = []
    (base / "images").mkdir(parents=True, exist_ok=True)
    (base / "annotations").mkdir(parents=True, exist_ok=True)
    for split in ("trainval", "test"):
        imgs, labels = images("train" if split == "trainval" else "test", n)
        lines = []
        for i, (image, label) in enumerate(zip(imgs, labels, strict=True)):
            cat = breeds[label][0].isupper() and label < 1  # Abyssinian is a cat; the next breeds are dogs
            stem = breeds[label].replace(" ", "_") if cat else breeds[label].lower().replace(" ", "_")
            image_id = f"{stem}_{split}{i}"
            image.convert("RGB").save(base / "images" / f"{image_id}.jpg", quality=95)
            lines.append(f"{image_id} {label + 1} {1 if cat else 2} {label + 1}")
        (base / "annotations" / f"{split}.txt").write_text("".join(f"{x}\n" for x in lines))
        listing += lines
    (base / "annotations" / "list.txt").write_text("#Image CLASS-ID SPECIES BREED ID\n"
                                                   + "".join(f"{x}\n" for x in sorted(listing, key=str.lower)))


def clip_benchmark_set(dataset: str, root: Path, n: int) -> None:
    {"cifar100": cifar100, "food101": food101, "pets": pets}.get(dataset, lambda r, k: wds_set(r, dataset, k))(root, n)


def cli(*args: str) -> str:
    run = subprocess.run([sys.executable, "-m", "clipcache.flows.cli.app", *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    if run.returncode:
        raise SystemExit(f"clipcache {args[0]} failed ({run.returncode}): {run.stderr.strip()[-2000:]}")
    return run.stdout


def read_back(out: Path, evaluated: dict[str, tuple[str | None, str, float]]) -> list[str]:
    """mteb's own readers over the export: each task's file by TaskResult.from_disk, the folder by ResultCache
    (validate_and_filter=True). ``evaluated``: task -> (the split its result was evaluated on, experiment id, value)
    from the warehouse; the split None for a clip_benchmark dataset, whose split mteb may name otherwise (food101's
    test is Food101ZeroShot's validation): there, the split must be one of the mteb task's eval_splits. The gaps."""
    import mteb

    gaps = []
    files = {p.stem: p for p in (out / "results").rglob("*.json") if p.name != "model_meta.json"}
    loaded = mteb.ResultCache(str(out)).load_results(include_remote=False, validate_and_filter=True)
    by_cache = {t.task_name: t for m in loaded.model_results for t in m.task_results}
    for task, (split, experiment, value) in sorted(evaluated.items()):
        if task not in files:
            gaps.append(f"{task}: no file")
            continue
        splits = [split] if split else list(mteb.get_task(task).metadata.eval_splits)
        rows = {s: r for s, rs in mteb.TaskResult.from_disk(files[task]).scores.items() for r in rs
                if r.get("clipcache_experiment_id") == experiment}
        if not rows or set(rows) - set(splits) or any(abs(r["main_score"] - value) > 1e-6 for r in rows.values()):
            gaps.append(f"{task}: main_score {value:.6f} of experiment {experiment} not (only) under {splits}: {rows}")
        elif any(s not in getattr(by_cache.get(task), "scores", {}) for s in rows):
            gaps.append(f"{task}: split {sorted(rows)} not loaded by ResultCache(validate_and_filter=True)")
    return gaps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="samples per split (mieb classification: 3x for train)")
    parser.add_argument("--keep", type=Path, help="build and run in this (new) folder and keep it")
    args = parser.parse_args()

    import datasets
    import mteb

    from clipcache.tasks.suites import load_suite

    datasets.disable_progress_bars()
    suite = load_suite("mieb_lite")
    tmp = tempfile.TemporaryDirectory(prefix="mieb-lite-suite-") if args.keep is None else None
    work = Path(tmp.name) if tmp else args.keep
    started = time.perf_counter()
    for entry in suite.datasets:
        root = work / "data" / entry.dataset.removeprefix("mieb:")  # {dataset} of a mieb: name is the task's name
        if entry.dataset.startswith("mieb:"):
            build(mteb.get_task(entry.dataset.removeprefix("mieb:")), root, args.n)
        else:
            clip_benchmark_set(entry.dataset, root, args.n)
    built = time.perf_counter() - started
    dirs = ["--output_dir", str(work / "out"), "--cache_dir", str(work / "cache")]
    cli("eval", "--suite", "mieb_lite", "--model", "tiny-shapes-clip", "--dataset_root", f"{work}/data/{{dataset}}",
        "--orchestrator", "local", "--quiet", *dirs)
    evaluated_s = time.perf_counter() - started - built
    table = cli("suite", "score", "mieb_lite", "--output_dir", str(work / "out"), "--bootstrap", "0")
    scores = json.loads(cli("suite", "score", "mieb_lite", "--output_dir", str(work / "out"), "--bootstrap", "0",
                            "--format", "json"))
    cli("suite", "export", "mieb_lite", "--format", "mteb", "--out", str(work / "mteb"), *dirs)
    from clipcache import connect

    con = connect(str(work / "out"))
    split_of = dict(con.execute("SELECT DISTINCT experiment_id, split FROM metrics").fetchall())
    keys = {e.dataset: e.source_key or e.dataset for e in suite.datasets}
    (score,) = [s for s in scores if s["model"] == "tiny-shapes-clip"]
    evaluated = {keys[r["dataset"]]: (split_of[r["experiment_id"]] if r["dataset"].startswith("mieb:") else None,
                                      r["experiment_id"], r["value"])
                 for r in score["per_dataset"]}
    gaps = read_back(work / "mteb", evaluated)
    print(table.rstrip())
    if not score["complete"]:
        gaps.append(f"suite score incomplete: {score['datasets_present']} of {score['datasets']}")
    splits = ", ".join(f"{k}: {n}" for k, n in sorted(Counter(split_of[v[1]] for v in evaluated.values()).items()))
    n_files = len([p for p in (work / "mteb" / "results").rglob("*.json") if p.name != "model_meta.json"])
    print(f"\nbuilt {len(suite.datasets)} datasets in {built:.0f} s; eval (1 run) {evaluated_s:.0f} s; "
          f"export: {n_files} task files; mteb read back {len(evaluated) - len(gaps)} of {len(evaluated)} "
          f"evaluated tasks, each under the split it was evaluated on (clipcache splits {splits}) with the warehouse's value")
    for gap in gaps:
        print("GAP  " + gap)
    if tmp:
        tmp.cleanup()
    return 1 if gaps else 0


if __name__ == "__main__":
    raise SystemExit(main())
