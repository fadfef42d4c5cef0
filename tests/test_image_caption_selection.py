"""image_caption_selection: the metric on hand-computed cases, SugarCrepe and Winoground local copies read and
scored equal to LAION clip_benchmark's own readers and evaluate(), repeated captions encoded once, bad input."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import open_clip
import pytest
import torch
from clip_benchmark.datasets.builder import build_dataset, get_dataset_collate_fn
from clip_benchmark.metrics import image_caption_selection

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.storage.naming import path_component
from clipcache.tasks.datasets import default_task, open_dataset
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.selection import selection_accuracy


def unit(rows):
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.norm(dim=-1, keepdim=True)


def test_hand_computed_items():
    # item 0: one image, the right caption closer; item 1: the negative caption closer; item 2: an exact tie (the
    # first caption, the right one, wins as torch.argmax keeps the first maximum)
    images = unit([[[1, 0]], [[1, 0]], [[1, 1]]])
    texts = unit([[[1, 0.1], [0, 1]], [[0, 1], [1, 0]], [[1, 0], [0, 1]]])
    metrics, tied = selection_accuracy(images, texts)
    assert metrics["text_acc"] == pytest.approx(2 / 3) and tied == 1
    assert metrics["image_acc"] == 1.0  # one image: every caption's best image is image 0
    assert metrics["acc"] == pytest.approx(2 / 3)


def test_winoground_style_two_by_two():
    # right pairing both ways; image right but text wrong (both images prefer caption 0: 1 and 0.91 against 0.20 and
    # 0.58, while each caption's best image is still its own); both wrong (swapped)
    images = unit([[[1, 0], [0, 1]], [[1, 0], [0.9, 0.4]], [[0, 1], [1, 0]]])
    texts = unit([[[1, 0], [0, 1]], [[1, 0], [0.2, 1]], [[1, 0], [0, 1]]])
    metrics, tied = selection_accuracy(images, texts)
    assert (metrics["text_acc"], metrics["image_acc"], metrics["acc"]) == pytest.approx((1 / 3, 2 / 3, 1 / 3))
    assert tied == 0


def shapes_images(n):
    from clipcache.tasks.datasets import shapes

    return shapes.load_shapes("fixture", "zeroshot_retrieval", "test", n)


def write_sugar_crepe(root, task="replace_att", n=24):
    """COCO-style val2017/ images and a SugarCrepe task file; items share images (several items per image) and
    repeat captions across items, as the real files do."""
    ds = shapes_images(n // 2)
    (root / "val2017").mkdir(parents=True, exist_ok=True)
    for i in range(len(ds)):
        ds.load_image(i).save(root / "val2017" / f"{i:012d}.jpg", quality=95)
    items = {}
    for k in range(n):
        i = k // 2
        other = ds.captions[(i + 1 + k % 3) % len(ds)][0]
        items[str(1000 + 7 * k)] = {"filename": f"{i:012d}.jpg", "caption": ds.captions[i][k % len(ds.captions[i])],
                                    "negative_caption": other}
    (root / f"{task}.json").write_text(json.dumps(items))
    return root


def write_winoground_cache(root, n=16):
    """The datasets cache clip_benchmark's WinoGround reads offline: facebook___winoground/default/0.0.0/<hash>/."""
    import datasets

    ds = shapes_images(2 * n)
    features = datasets.Features({"id": datasets.Value("int32"), "image_0": datasets.Image(),
                                  "image_1": datasets.Image(), "caption_0": datasets.Value("string"),
                                  "caption_1": datasets.Value("string")})
    table = datasets.Dataset.from_dict(
        {"id": list(range(n)), "image_0": [ds.load_image(2 * i) for i in range(n)],
         "image_1": [ds.load_image(2 * i + 1) for i in range(n)],
         "caption_0": [ds.captions[2 * i][0] for i in range(n)],
         "caption_1": [ds.captions[2 * i + 1][0] for i in range(n)]}, features=features)
    table.save_to_disk(str(root / "saved"))
    folder = root / "facebook___winoground" / "default" / "0.0.0" / ("ab" * 20)
    folder.mkdir(parents=True)
    shutil.copy(root / "saved" / "data-00000-of-00001.arrow", folder / "winoground-test.arrow")
    info = json.loads((root / "saved" / "dataset_info.json").read_text())
    info.update({"builder_name": "winoground", "dataset_name": "winoground", "config_name": "default",
                 "version": {"version_str": "0.0.0", "major": 0, "minor": 0, "patch": 0},
                 "splits": {"test": {"name": "test", "num_examples": n, "dataset_name": "winoground",
                                     "num_bytes": os.path.getsize(folder / "winoground-test.arrow")}}})
    (folder / "dataset_info.json").write_text(json.dumps(info))
    shutil.rmtree(root / "saved")
    return root


def clip_benchmark_selection(model_dir, name, root, batch_size=8):
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{model_dir}", device="cpu")
    model.eval()
    ds = build_dataset(dataset_name=name, root=str(root), transform=transform, split="test", download=False,
                       task="image_caption_selection")
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=0,
                                         collate_fn=get_dataset_collate_fn(name))
    return image_caption_selection.evaluate(model, loader, open_clip.get_tokenizer(f"local-dir:{model_dir}"),
                                            "cpu", amp=False)


def clipcache_selection(tmp_path, name, root):
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    assert default_task(name, str(root)) == "image_caption_selection"
    return evaluate_one("image_caption_selection", session, DataSource(name, str(root)),
                        EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(8, 2))


def test_sugar_crepe_equals_clip_benchmark(tmp_path, tiny_model_dir):
    root = write_sugar_crepe(tmp_path / "sugar")
    theirs = clip_benchmark_selection(tiny_model_dir, "sugar_crepe/replace_att", root)
    scored = clipcache_selection(tmp_path, "sugar_crepe/replace_att", root)
    assert {k: scored.metrics[k] for k in theirs} == theirs
    assert scored.n_samples == 24 and theirs["acc"] > 0.5  # a trained model, above chance
    ds = open_dataset("sugar_crepe/replace_att", str(root), "test", None)
    assert len(ds) == 12 and ds.item_images.shape == (24, 1)  # each image once, for two items
    texts = {t for pair in ds.captions for t in pair}
    store = EmbeddingStore(tmp_path / "cache")
    [entry] = [e for e in map(store.open, store.keys()) if e.meta.get("captions")]
    assert entry.meta["captions"] == 48 and entry.count == len(texts) < 48  # repeated captions are encoded once


def test_winoground_local_copy_equals_clip_benchmark(tmp_path, tiny_model_dir):
    root = write_winoground_cache(tmp_path / "wino")
    theirs = clip_benchmark_selection(tiny_model_dir, "winoground", root)
    scored = clipcache_selection(tmp_path, "winoground", root)
    assert {k: scored.metrics[k] for k in theirs} == theirs and scored.n_samples == 16
    # the repository's Parquet files (a `hf download` snapshot) read the same items
    import pyarrow as pa
    import pyarrow.parquet as pq

    [arrow] = (root / "facebook___winoground").rglob("*.arrow")
    with pa.memory_map(str(arrow)) as source:
        table = pa.ipc.open_stream(source).read_all()
    (tmp_path / "snapshot" / "data").mkdir(parents=True)
    pq.write_table(table, tmp_path / "snapshot" / "data" / "test-00000-of-00001.parquet")
    cached, snapshot = (open_dataset("winoground", str(r), "test", None) for r in (root, tmp_path / "snapshot"))
    assert snapshot.captions == cached.captions and len(snapshot) == len(cached) == 32
    assert all(snapshot.read_image_bytes(i) == cached.read_image_bytes(i) for i in range(len(cached)))


def test_limit_takes_the_first_items(tmp_path):
    root = write_sugar_crepe(tmp_path / "sugar")
    ds = open_dataset("sugar_crepe/replace_att", str(root), "test", 5)
    assert ds.n_items == 5 and len(ds) == 3


@pytest.mark.parametrize("damage, message", [
    ("missing_image", r"item '1014': image .*000000000001.jpg not found"),
    ("missing_json", r"replace_att.json not found \(clip_benchmark fetches it from https://raw.githubusercontent"),
    ("bad_json", r"replace_att.json is not a JSON file"),
    ("bad_item", r"item '1000': expected strings 'filename', 'caption' and 'negative_caption'"),
    ("no_images", r"val2017/ not found \(the COCO 2017 validation images"),
])
def test_sugar_crepe_bad_input_is_one_line(tmp_path, damage, message):
    root = write_sugar_crepe(tmp_path / "sugar")
    ann = root / "replace_att.json"
    if damage == "missing_image":
        (root / "val2017" / "000000000001.jpg").unlink()
    elif damage == "missing_json":
        ann.unlink()
    elif damage == "bad_json":
        ann.write_text("{not json")
    elif damage == "bad_item":
        items = json.loads(ann.read_text())
        items["1000"] = {"filename": "x.jpg"}
        ann.write_text(json.dumps(items))
    else:
        shutil.rmtree(root / "val2017")
    with pytest.raises(DatasetError, match=message) as error:
        open_dataset("sugar_crepe/replace_att", str(root), "test", None)
    assert "\n" not in str(error.value)


def test_winoground_without_a_local_copy_names_what_is_expected(tmp_path):
    with pytest.raises(DatasetError, match=r"no local copy of facebook/winoground .*`hf download"):
        open_dataset("winoground", str(tmp_path), "test", None)
    with pytest.raises(DatasetError, match="needs --dataset_root"):
        open_dataset("winoground", None, "test", None)


def test_cli_runs_the_task_and_rescore_encodes_nothing(prefect_server, tmp_path, capsys):
    from clipcache.flows.cli import main

    root = write_sugar_crepe(tmp_path / "sugar")
    args = ["--model", "tiny-shapes-clip", "--dataset", "sugar_crepe/replace_att", "--dataset_root", str(root),
            "--quiet", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    assert main(["eval", *args]) == 0
    saved = json.loads((tmp_path / "out" / "tiny-shapes-clip" /
                        f"{path_component('sugar_crepe/replace_att')}_image_caption_selection.json").read_text())
    assert saved["task"] == "image_caption_selection" and set(saved["metrics"]) >= {"acc", "image_acc", "text_acc"}
    capsys.readouterr()
    assert main(["cache", "--cache_dir", str(tmp_path / "cache"), "ls", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert sorted(r["kind"] for r in rows) == ["caption", "image"]
    assert all(r["tasks"] == ["image_caption_selection"] for r in rows)
    assert main(["rescore", *args]) == 0
    np.testing.assert_equal(json.loads((tmp_path / "out" / "tiny-shapes-clip" /
                                        f"{path_component('sugar_crepe/replace_att')}_image_caption_selection.json").read_text())["metrics"],
                            saved["metrics"])
