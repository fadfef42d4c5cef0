"""Multilabel image classification data for ``--task multilabel_probe`` (MIEB's VOC2007 protocol), two layouts, and
the dataset source that finds them by their files. docs/mieb.md describes both.

- PASCAL VOC 2007 as distributed (``VOCtrainval_06-Nov-2007.tar``, ``VOCtest_06-Nov-2007.tar``)::

      <root>/VOCdevkit/VOC2007/ImageSets/Main/{train,val,trainval,test}.txt    one image id a line
      <root>/VOCdevkit/VOC2007/Annotations/<id>.xml                           the image's objects
      <root>/VOCdevkit/VOC2007/JPEGImages/<id>.jpg

  An image's labels are the classes of its objects that are not marked ``difficult``: the rule of the devkit's
  per-class lists (``<class>_<split>.txt``: 1 for such images, 0 for an image whose only objects of the class are
  difficult) and of mteb's hub copy ``mteb/VOC2007``, whose per-class image counts (mteb's descriptive statistics:
  train 2,501 images, person 1,025, ..., test 4,952, person 2,007, ...) are the devkit's non-difficult counts.
  Classes are indexed in the devkit's order (aeroplane = 0 ... tvmonitor = 19), as the hub copy's ``classes``
  column. (clip_benchmark's ``voc2007_multilabel`` counts difficult objects too; that reader is unchanged.)
  Annotations are parsed with no DTD allowed: a file that declares one (entities, external references) is refused.

- Users' own data::

      <root>/multilabel_<split>.jsonl   {"image_path": "img/1.jpg", "labels": ["cat", "person"]}
      <root>/multilabel_<split>.csv     header image_path,labels; labels separated by "|" (empty: no label)
      <root>/classnames.txt             optional: one class a line, their order the class indices

  Image paths are relative to the folder (or absolute). Without ``classnames.txt`` the classes are every label that
  any ``multilabel_*`` file of the folder uses, sorted (numerically when all are integers), so every split indexes
  them alike; with it, a label it does not list is an error naming the file and line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.datasets.base import ClassPrompts, iter_jsonl_records, resolve_image_path
from clipcache.tasks.datasets.labelled import DEFAULT_TEMPLATES, LabelledImages
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource, OpenOptions

VOC_FOLDER = Path("VOCdevkit") / "VOC2007"
VOC_SPLITS = ("train", "val", "trainval", "test")
LABEL_FILE = "multilabel_{split}"
LABEL_SEPARATOR = "|"


@dataclass
class MultilabelImages(LabelledImages):
    """Images with a multi-hot row of classes each (``labels``: (n, classes) uint8)."""

    layout: str = ""

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        labels = np.zeros((0, 0)) if self.labels is None else self.labels
        return {"format": self.layout, "images": memo.fingerprint(self.image_paths, root=self.root),
                "labels": digest(labels.tolist()),
                "classes": self.prompts.classnames if self.prompts else []}


def multilabel_root(root: Path) -> str | None:
    """Which layout ``root`` holds (``voc2007`` or ``label-lists``), or None; a few stat calls."""
    if (root / VOC_FOLDER / "Annotations").is_dir():
        return "voc2007"
    if any(root.glob("multilabel_*.jsonl")) or any(root.glob("multilabel_*.csv")):
        return "label-lists"
    return None


def open_multilabel(name: str, root: Path, split: str, limit: int | None) -> MultilabelImages:
    """The ``split`` of whichever layout ``root`` holds; exactly the first ``limit`` images when set."""
    layout = multilabel_root(root)
    if layout == "voc2007":
        return open_voc2007(name, root, split, limit)
    if layout == "label-lists":
        return open_label_lists(name, root, split, limit)
    raise DatasetError(f"dataset {name!r}: {root} holds no multilabel layout (VOCdevkit/VOC2007/ or "
                       f"multilabel_<split>.jsonl / .csv)")


# -- PASCAL VOC 2007 --------------------------------------------------------------------------------------------------
VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")


def parse_xml_refusing_dtd(path: Path) -> Any:
    """``path`` parsed by ElementTree after a pass of expat that refuses any DTD: entity declarations and external
    entities live in a DTD, so a file without one cannot expand entities (a billion-laughs file is refused, not
    expanded). DatasetError naming the file for a refused or malformed one."""
    import xml.etree.ElementTree as ET
    from xml.parsers import expat

    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror})") from e

    def refuse(*_: Any) -> None:
        raise DatasetError(f"{path}: declares a DTD (<!DOCTYPE ...>), which a VOC annotation never does; refused "
                           f"(entities are not expanded)")

    checker = expat.ParserCreate()
    checker.StartDoctypeDeclHandler = refuse
    checker.EntityDeclHandler = refuse
    checker.ExternalEntityRefHandler = refuse  # type: ignore[assignment]
    try:
        checker.Parse(data, True)
        return ET.fromstring(data)
    except (expat.ExpatError, ET.ParseError) as e:
        raise DatasetError(f"{path}: not well-formed XML ({e})") from e


def voc_labels(path: Path) -> list[int]:
    """The sorted class indices of the non-difficult objects of one annotation file."""
    tree = parse_xml_refusing_dtd(path)
    found = set()
    for obj in tree.findall("object"):
        label = (obj.findtext("name") or "").strip()
        if label not in VOC_CLASSES:
            raise DatasetError(f"{path}: object name {label!r} is not a VOC class")
        if (obj.findtext("difficult") or "0").strip() != "1":
            found.add(VOC_CLASSES.index(label))
    return sorted(found)


def open_voc2007(name: str, root: Path, split: str, limit: int | None) -> MultilabelImages:
    base = root / VOC_FOLDER
    index = base / "ImageSets" / "Main" / f"{split}.txt"
    if not index.is_file():
        there = [s for s in VOC_SPLITS if (base / "ImageSets" / "Main" / f"{s}.txt").is_file()]
        raise DatasetError(f"dataset {name!r}: {index} not found (splits there: {', '.join(there) or 'none'}; "
                           f"files: http://host.robots.ox.ac.uk/pascal/VOC/voc2007/)")
    ids = [line.split()[0] for line in index.read_text(encoding="utf-8").splitlines() if line.split()][:limit]
    if not ids:
        raise DatasetError(f"dataset {name!r}: {index} lists no image")
    labels = np.zeros((len(ids), len(VOC_CLASSES)), dtype=np.uint8)
    for row, image_id in enumerate(ids):
        labels[row, voc_labels(base / "Annotations" / f"{image_id}.xml")] = 1
    images = base / "JPEGImages"
    return MultilabelImages(name=name, split=split, task="zeroshot_classification", labels=labels,
                            prompts=ClassPrompts(list(VOC_CLASSES), list(DEFAULT_TEMPLATES), "en", str(base)),
                            multilabel=True, root=images, image_paths=[images / f"{i}.jpg" for i in ids],
                            origins=[f"{index.name}: {i}" for i in ids], layout="voc2007-mteb")


# -- label lists ------------------------------------------------------------------------------------------------------
def _label_file(root: Path, split: str) -> Path | None:
    stem = LABEL_FILE.format(split=split)
    return next((root / f"{stem}{s}" for s in (".jsonl", ".csv") if (root / f"{stem}{s}").is_file()), None)


def _records(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, image path, labels) of each record of a label file."""
    out = []
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            if not {"image_path", "labels"} <= set(reader.fieldnames or []):
                raise DatasetError(f"{path}: expected the header image_path,labels (labels separated by "
                                   f"{LABEL_SEPARATOR!r})")
            for i, row in enumerate(reader):
                labels = [s.strip() for s in (row["labels"] or "").split(LABEL_SEPARATOR) if s.strip()]
                out.append((i + 2, str(row["image_path"] or ""), labels))
        return out
    for line, record in iter_jsonl_records(path, ("image_path", "labels")):
        given = record["labels"]
        if not isinstance(given, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                                  for v in given):
            raise DatasetError(f"{path} line {line}: labels must be a list of class names (strings or integers)")
        out.append((line, str(record["image_path"]), [str(v) for v in given]))
    return out


def _classes(root: Path) -> tuple[list[str], bool]:
    """The class names and whether classnames.txt fixed them."""
    names = root / "classnames.txt"
    if names.is_file():
        return [c.strip() for c in names.read_text(encoding="utf-8").splitlines() if c.strip()], True
    used = {label for path in sorted([*root.glob("multilabel_*.jsonl"), *root.glob("multilabel_*.csv")])
            for _, _, labels in _records(path) for label in labels}
    if all(u.lstrip("-").isdigit() for u in used):
        return sorted(used, key=int), False
    return sorted(used), False


def open_label_lists(name: str, root: Path, split: str, limit: int | None) -> MultilabelImages:
    path = _label_file(root, split)
    if path is None:
        there = sorted({p.stem.removeprefix("multilabel_") for p in [*root.glob("multilabel_*.jsonl"),
                                                                     *root.glob("multilabel_*.csv")]})
        raise DatasetError(f"dataset {name!r}: no {LABEL_FILE.format(split=split)}.jsonl or .csv in {root} "
                           f"(splits there: {', '.join(there) or 'none'})")
    classes, listed = _classes(root)
    index = {c: i for i, c in enumerate(classes)}
    records = _records(path)[:limit]
    if not records:
        raise DatasetError(f"dataset {name!r}: {path} has no records")
    labels = np.zeros((len(records), len(classes)), dtype=np.uint8)
    paths, origins = [], []
    for row, (line, image, names) in enumerate(records):
        unknown = [n for n in names if n not in index]
        if unknown:
            raise DatasetError(f"{path} line {line}: label {unknown[0]!r} is not in classnames.txt" if listed else
                               f"{path} line {line}: label {unknown[0]!r} is unknown")
        found = resolve_image_path(image, root)
        if found is None:
            raise DatasetError(f"{path} line {line}: image_path {image!r} not found")
        labels[row, [index[n] for n in names]] = 1
        paths.append(found)
        origins.append(f"{path.name} line {line}")
    return MultilabelImages(name=name, split=split, task="zeroshot_classification", labels=labels,
                            prompts=ClassPrompts(classes, list(DEFAULT_TEMPLATES), "en", str(root)), multilabel=True,
                            root=root, image_paths=paths, origins=origins, layout="multilabel-label-lists")


# -- the source that finds them ---------------------------------------------------------------------------------------
class MultilabelFolders(DatasetSource):
    """Asked after the sources of other folders (priority 62): ``voc2007_multilabel`` with a VOCdevkit root stays
    clip_benchmark's zero-shot set under ``--task auto``; ``--task multilabel_probe`` reads the folder itself."""

    name = "multilabel"
    description = "a multilabel image folder (VOCdevkit/VOC2007, or multilabel_<split>.jsonl / .csv label lists)"
    priority = 62
    only_for = ("multilabel_probe",)

    def claims(self, ref: DatasetRef) -> bool:
        root = ref.root
        return root is not None and multilabel_root(root) is not None

    def task(self, ref: DatasetRef) -> str:
        return "multilabel_probe"

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> MultilabelImages:
        return open_multilabel(ref.name, ref.folder("VOCdevkit/VOC2007 or multilabel_<split>.jsonl"), split, limit)
