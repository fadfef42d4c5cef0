"""Users' own classification data, two layouts:

- ``imagefolder``: ``<root>/<class name>/<image>`` — one folder per class; classes are the folder names in sorted
  order (label = position), images are the files with an image extension directly inside each class folder.
- ``image_labels``: ``<root>/image_labels.csv`` (columns ``image_path,label``) or ``<root>/image_labels.jsonl``
  (``{"image_path": ..., "label": ...}``) with ``<root>/classnames.txt``; a label is a class index or a class name.

Both use ``<root>/zeroshot_classification_templates.txt`` if present, else the single template
``"a photo of a {c}."``; ``--classnames`` / ``--templates`` override either. Relative image paths are resolved next
to the label file first, then in the working directory.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import (
    ClassPrompts,
    EvalDataset,
    iter_jsonl_records,
    relative_name,
    resolve_image_path,
)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
DEFAULT_TEMPLATES = ["a photo of a {c}."]


@dataclass
class LabelledImages(EvalDataset):
    root: Path = Path(".")
    image_paths: list[Path] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)  # where each sample was declared, for messages

    def __len__(self) -> int:
        return len(self.image_paths)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        # Images and their labels; class names and templates only change prompts (cached by their own text).
        return {"format": "labelled-images", "images": memo.fingerprint(self.image_paths, root=self.root),
                "labels": [] if self.labels is None else self.labels.tolist()}

    def describe(self, index: int) -> str:
        return f"{self.image_paths[index]} ({self.origins[index]})"

    def sample_key(self, index: int) -> str:
        return relative_name(self.image_paths[index], self.root)

    def read_image_bytes(self, index: int) -> bytes:
        return self.image_paths[index].read_bytes()


def _templates(root: Path) -> list[str]:
    path = root / "zeroshot_classification_templates.txt"
    if not path.exists():
        return list(DEFAULT_TEMPLATES)
    templates = [t.strip() for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
    bad = [t for t in templates if "{c}" not in t]
    if bad or not templates:
        raise DatasetError(f"{path}: " + (f"template {bad[0]!r} has no {{c}} placeholder" if bad else "no templates"))
    return templates


def _finish(ds: LabelledImages, labels: list[int], classnames: list[str], limit: int | None) -> LabelledImages:
    if limit is not None:
        ds.image_paths, ds.origins, labels = ds.image_paths[:limit], ds.origins[:limit], labels[:limit]
    if not ds.image_paths:
        raise DatasetError(f"dataset {ds.name!r}: no images found under {ds.root}")
    ds.labels = np.asarray(labels, dtype=np.int64)
    ds.prompts = ClassPrompts(classnames, _templates(ds.root), "en", str(ds.root))
    return ds


def load_imagefolder(name: str, root: Path, split: str, limit: int | None) -> LabelledImages:
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"dataset {name!r}: directory {root} does not exist")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DatasetError(f"dataset {name!r}: {root} has no class folders (expected <root>/<class>/<image>)")
    ds = LabelledImages(name=name, split=split, task="zeroshot_classification", root=root)
    labels: list[int] = []
    for label, cls in enumerate(classes):
        images = sorted(p for p in (root / cls).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not images:
            raise DatasetError(f"dataset {name!r}: class folder {root / cls} has no images")
        ds.image_paths += images
        ds.origins += [f"class folder {cls!r}"] * len(images)
        labels += [label] * len(images)
    return _finish(ds, labels, classes, limit)


def _records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = {"image_path", "label"} - set(reader.fieldnames or [])
            if missing:
                raise DatasetError(f"{path}: missing column(s) {', '.join(sorted(missing))} (expected image_path,label)")
            return [(i + 2, row) for i, row in enumerate(reader)]
    return list(iter_jsonl_records(path, ("image_path", "label")))


def load_image_labels(name: str, root: Path, split: str, limit: int | None) -> LabelledImages:
    root = Path(root)
    index = next((root / f for f in ("image_labels.csv", "image_labels.jsonl") if (root / f).is_file()), None)
    if index is None:
        raise DatasetError(f"dataset {name!r}: {root} has no image_labels.csv or image_labels.jsonl")
    names_path = root / "classnames.txt"
    if not names_path.is_file():
        raise DatasetError(f"dataset {name!r}: {names_path} is missing (one class name per line)")
    classnames = [c.strip() for c in names_path.read_text(encoding="utf-8").splitlines() if c.strip()]
    by_name = {c: i for i, c in enumerate(classnames)}
    ds = LabelledImages(name=name, split=split, task="zeroshot_classification", root=root)
    labels: list[int] = []
    for line_no, record in _records(index):
        if limit is not None and len(labels) >= limit:
            break
        where = f"{index.name} line {line_no}"
        raw = str(record["label"]).strip()
        label = int(raw) if raw.lstrip("-").isdigit() else by_name.get(raw)
        if label is None or not 0 <= label < len(classnames):
            raise DatasetError(f"{index} line {line_no}: label {raw!r} is neither a class index below "
                               f"{len(classnames)} nor a name in {names_path.name}")
        found = resolve_image_path(str(record["image_path"]), root)
        if found is None:
            raise DatasetError(f"{index} line {line_no}: image_path {str(record['image_path'])!r} not found")
        ds.image_paths.append(found)
        ds.origins.append(where)
        labels.append(label)
    return _finish(ds, labels, classnames, limit)
