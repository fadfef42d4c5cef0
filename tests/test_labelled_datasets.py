"""Users' classification data: image-folder trees and image_labels.csv / .jsonl, with their bad-input messages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.datasets.shapes import load_shapes


@pytest.fixture
def shapes_images(tmp_path):
    ds = load_shapes("x", "zeroshot_classification", "test", 12)
    return [(ds.load_image(i), ds.samples[i]) for i in range(12)]


def make_tree(root, samples):
    for i, (img, s) in enumerate(samples):
        folder = root / f"{s.colour} {s.shape}"
        folder.mkdir(parents=True, exist_ok=True)
        img.save(folder / f"{i:03d}.png")
    return root


def test_imagefolder(tmp_path, shapes_images):
    root = make_tree(tmp_path / "tree", shapes_images)
    ds = open_dataset("imagefolder", str(root), "test", None)
    assert ds.task == "zeroshot_classification" and len(ds) == 12
    assert ds.prompts.classnames == sorted({f"{s.colour} {s.shape}" for _, s in shapes_images})
    assert ds.prompts.templates == ["a photo of a {c}."]
    assert [ds.prompts.classnames[label] for label in ds.labels] == [p.parent.name for p in ds.image_paths]
    (root / "zeroshot_classification_templates.txt").write_text("a drawing of a {c}.\n")
    assert open_dataset("imagefolder", str(root), "test", 5).prompts.templates == ["a drawing of a {c}."]
    assert len(open_dataset("imagefolder", str(root), "test", 5)) == 5


def test_image_labels_csv_and_jsonl(tmp_path, shapes_images):
    root = tmp_path / "labelled"
    (root / "img").mkdir(parents=True)
    names = sorted({f"{s.colour} {s.shape}" for _, s in shapes_images})
    (root / "classnames.txt").write_text("\n".join(names) + "\n")
    rows = []
    for i, (img, s) in enumerate(shapes_images):
        img.save(root / "img" / f"{i}.png")
        name = f"{s.colour} {s.shape}"
        rows.append((f"img/{i}.png", name if i % 2 else str(names.index(name))))  # names and indices both work
    (root / "image_labels.csv").write_text("image_path,label\n" + "\n".join(f"{p},{lab}" for p, lab in rows) + "\n")
    ds = open_dataset("image_labels", str(root), "test", None)
    expected = [names.index(f"{s.colour} {s.shape}") for _, s in shapes_images]
    np.testing.assert_array_equal(ds.labels, expected)
    (root / "image_labels.csv").unlink()
    (root / "image_labels.jsonl").write_text("\n".join(json.dumps({"image_path": p, "label": lab}) for p, lab in rows))
    np.testing.assert_array_equal(open_dataset("image_labels", str(root), "test", None).labels, expected)


def test_labelled_bad_input(tmp_path, shapes_images):
    with pytest.raises(DatasetError, match="does not exist"):
        open_dataset("imagefolder", str(tmp_path / "none"), "test", None)
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(DatasetError, match="class folder .*cat has no images"):
        open_dataset("imagefolder", str(tmp_path / "empty"), "test", None)
    with pytest.raises(DatasetError, match="needs --dataset_root"):
        open_dataset("imagefolder", None, "test", None)
    root = tmp_path / "lab"
    root.mkdir()
    with pytest.raises(DatasetError, match="no image_labels.csv or image_labels.jsonl"):
        open_dataset("image_labels", str(root), "test", None)
    (root / "image_labels.csv").write_text("path,label\nx.png,0\n")
    with pytest.raises(DatasetError, match="classnames.txt is missing"):
        open_dataset("image_labels", str(root), "test", None)
    (root / "classnames.txt").write_text("cat\ndog\n")
    with pytest.raises(DatasetError, match="missing column"):
        open_dataset("image_labels", str(root), "test", None)
    shapes_images[0][0].save(root / "a.png")
    (root / "image_labels.csv").write_text("image_path,label\na.png,bird\n")
    with pytest.raises(DatasetError, match=r"line 2: label 'bird' is neither"):
        open_dataset("image_labels", str(root), "test", None)
    (root / "image_labels.csv").write_text("image_path,label\nmissing.png,cat\n")
    with pytest.raises(DatasetError, match=r"line 2: image_path 'missing.png' not found"):
        open_dataset("image_labels", str(root), "test", None)


def test_corrupt_image_in_a_tree_is_named(tmp_path, shapes_images):
    root = make_tree(tmp_path / "tree", shapes_images[:3])
    bad = next((root).rglob("*.png"))
    bad.write_bytes(b"garbage")
    ds = open_dataset("imagefolder", str(root), "test", None)
    index = ds.image_paths.index(bad)
    with pytest.raises(DatasetError, match=f"{bad.name}.*class folder"):
        ds.load_image(index)
