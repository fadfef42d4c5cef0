"""clip_benchmark's original layouts under ``--dataset_root``, read as clip_benchmark reads them: the pieces the
readers share (clip_benchmark's prompts, ImageNet's WordNet ids, ``FolderImages``, ImageFolder's file order) and the
readers of cifar10/100, caltech101, class folders (fer2013), objectnet and voc2007. The ImageNet family is in
``imagenet_layouts.py``, the caption sets in ``original_captions.py``, the torchvision-backed sets in
``torchvision_sets.py``; ``layouts.py`` says which reader reads which name.

- ``cifar10``: ``<root>/cifar-10-batches-py/`` (``data_batch_1`` .. ``data_batch_5``, ``test_batch``,
  ``batches.meta``); ``cifar100``: ``<root>/cifar-100-python/`` (``train``, ``test``, ``meta``). Python pickles of
  3,072-byte rows (3 x 32 x 32, channel-major), as torchvision's CIFAR10/CIFAR100 read them (but with
  ``safe_pickle.py``, which runs no code from them, where torchvision calls ``pickle.load``): rows in file order,
  the train split the five batches in order. Class names are the files' own (``label_names`` / ``fine_label_names``),
  as clip_benchmark keeps torchvision's; templates are clip_benchmark's for the dataset in the chosen language
  (tasks/datasets/clip_benchmark/prompts/clip_benchmark.json), falling back to its ImageNet templates as it does.

Nothing is downloaded: a missing file is named, with where clip_benchmark (torchvision) gets it.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset, relative_name
from clipcache.tasks.datasets.safe_pickle import load_dataset_pickle

PROMPTS = Path(__file__).with_name("prompts") / "clip_benchmark.json"
@dataclass(frozen=True)
class CifarLayout:
    folder: str
    splits: dict[str, tuple[str, ...]]
    meta: str
    names: str
    labels: str
    url: str


CIFAR = {
    "cifar10": CifarLayout("cifar-10-batches-py", {"train": tuple(f"data_batch_{i}" for i in range(1, 6)),
                                                   "test": ("test_batch",)}, "batches.meta", "label_names", "labels",
                           "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    "cifar100": CifarLayout("cifar-100-python", {"train": ("train",), "test": ("test",)}, "meta", "fine_label_names",
                            "fine_labels", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
}


@cache
def clip_benchmark_prompts() -> dict[str, Any]:
    return {k: v for k, v in json.loads(PROMPTS.read_text(encoding="utf-8")).items() if not k.startswith("_")}


def templates_for(dataset: str, language: str) -> list[str]:
    """clip_benchmark's templates for ``dataset`` in ``language``, else its ImageNet ones (its own fallback)."""
    data = clip_benchmark_prompts()[language]["templates"]
    return list(data.get(dataset) or data["imagenet1k"])


@dataclass
class ArrayImages(EvalDataset):
    """Images held as an (n, H, W, 3) uint8 array, decoded from the dataset's own files up front."""

    pixels: np.ndarray = field(default_factory=lambda: np.zeros((0, 1, 1, 3), dtype=np.uint8))
    files: list[Path] = field(default_factory=list)
    layout: str = ""

    def __len__(self) -> int:
        return len(self.pixels)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {"format": self.layout, "files": [memo.sha256(f) for f in self.files], "n": len(self)}

    def describe(self, index: int) -> str:
        return f"{self.files[0].parent} ({self.split} split) image {index}"

    def read_image_bytes(self, index: int) -> Image.Image:
        return Image.fromarray(self.pixels[index])


def _unpickle(path: Path, name: str, url: str) -> dict:
    if not path.is_file():
        raise DatasetError(f"dataset {name!r}: {path} not found (clip_benchmark gets it through torchvision from "
                           f"{url}; unpack it under --dataset_root)")
    try:
        batch = load_dataset_pickle(path)  # NumPy arrays and containers only: a pickle from the folder runs no code
    except DatasetError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            OSError) as e:  # pickle raises any of these for a damaged file
        raise DatasetError(f"dataset {name!r}: {path} is not a CIFAR pickle ({type(e).__name__}: {e})") from e
    if not isinstance(batch, dict):
        raise DatasetError(f"dataset {name!r}: {path} is not a CIFAR pickle (it holds a {type(batch).__name__}, not "
                           f"a dict)")
    return batch


def load_cifar(name: str, root: Path, split: str, limit: int | None) -> ArrayImages:
    spec = CIFAR[name]
    if split not in ("train", "test"):
        raise DatasetError(f"dataset {name!r} has the splits train and test (asked for {split!r})")
    folder = Path(root) / spec.folder
    files = [folder / f for f in spec.splits[split]]
    meta = _unpickle(folder / spec.meta, name, spec.url)
    classnames = meta.get(spec.names)
    if not isinstance(classnames, list) or not classnames:
        raise DatasetError(f"dataset {name!r}: {folder / spec.meta} has no {spec.names!r}")
    pixels, labels, read = [], [], []
    for path in files:
        batch = _unpickle(path, name, spec.url)
        try:
            data = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            targets = np.asarray(batch[spec.labels], dtype=np.int64)
        except (KeyError, ValueError) as e:
            raise DatasetError(f"dataset {name!r}: {path} does not hold 'data' rows of 3,072 bytes and "
                               f"{spec.labels!r} ({type(e).__name__}: {e})") from e
        if len(data) != len(targets):
            raise DatasetError(f"dataset {name!r}: {path} has {len(data)} images and {len(targets)} labels")
        pixels.append(data)
        labels.append(targets)
        read.append(path)
        if limit is not None and sum(len(p) for p in pixels) >= limit:
            break
    all_pixels, all_labels = np.concatenate(pixels)[:limit], np.concatenate(labels)[:limit]
    bad = np.flatnonzero((all_labels < 0) | (all_labels >= len(classnames)))
    if len(bad):
        raise DatasetError(f"dataset {name!r}: image {int(bad[0])} has label {int(all_labels[bad[0]])}, outside the "
                           f"{len(classnames)} classes of {folder / spec.meta}")
    prompts = ClassPrompts([str(c) for c in classnames], templates_for(name, "en"), "en", str(folder))
    return ArrayImages(name=name, split=split, task="zeroshot_classification", labels=all_labels, prompts=prompts,
                       pixels=all_pixels, files=read, layout=f"torchvision-{name}")


# -- Shared by the folder readers: ImageNet's WordNet ids, FolderImages, ImageFolder's order ---------------------------
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
WNIDS = Path(__file__).with_name("prompts") / "imagenet_wnids.json"


@cache
def imagenet_wnids() -> list[str]:
    return list(json.loads(WNIDS.read_text(encoding="utf-8"))["wnids"])


@dataclass
class FolderImages(EvalDataset):
    paths: list[Path] = field(default_factory=list)
    root: Path = Path(".")
    layout: str = ""

    def __len__(self) -> int:
        return len(self.paths)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {"format": self.layout, "images": memo.fingerprint(self.paths, root=self.root)}

    def describe(self, index: int) -> str:
        return str(self.paths[index])

    def sample_key(self, index: int) -> str:
        return relative_name(self.paths[index], self.root)

    def read_image_bytes(self, index: int) -> bytes | Image.Image:
        return self.paths[index].read_bytes()


def folder_images(folder: Path) -> list[Path]:
    """Image files under ``folder`` in torchvision ImageFolder's order: ``sorted(os.walk(...))``, names sorted."""
    import os

    out = []
    for here, _, names in sorted(os.walk(folder, followlinks=True)):
        out += [Path(here) / n for n in sorted(names) if n.lower().endswith(IMAGE_EXTENSIONS)]
    return out


def images_by_class(base: Path, classes: list[str]) -> tuple[list[Path], list[int]]:
    """The images of each class folder ``base/<class>`` in turn (ImageFolder's order), labelled by position."""
    paths: list[Path] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        files = folder_images(base / c)
        paths += files
        labels += [i] * len(files)
    return paths, labels


def load_caltech101(name: str, root: Path, split: str, limit: int | None, prompts: ClassPrompts,
                    source: str) -> FolderImages:
    """clip_benchmark's own Caltech101 (torchvision's, keeping the background class): categories are the sorted
    entries of ``caltech101/101_ObjectCategories``; category ``c`` with ``n`` ``*.jpg`` files contributes
    ``image_0001.jpg`` ... ``image_{n:04d}.jpg``. There is no split: every image is read."""
    folder = Path(root) / "caltech101" / "101_ObjectCategories"
    if not folder.is_dir():
        raise DatasetError(f"dataset {name!r}: {folder} not found (files: {source})")
    categories = sorted(p.name for p in folder.iterdir())
    if len(categories) != len(prompts.classnames):
        raise DatasetError(f"dataset {name!r}: {folder} has {len(categories)} category folders, clip_benchmark's "
                           f"class names are {len(prompts.classnames)} (the 101 categories and the background)")
    paths: list[Path] = []
    labels: list[int] = []
    for i, c in enumerate(categories):
        n = len(list((folder / c).glob("*.jpg")))
        paths += [folder / c / f"image_{k:04d}.jpg" for k in range(1, n + 1)]
        labels += [i] * n
    missing = next((p for p in paths[:limit] if not p.is_file()), None)
    if missing is not None:
        raise DatasetError(f"dataset {name!r}: {missing} not found (clip_benchmark numbers each category's images "
                           f"image_0001.jpg ... image_<n>.jpg)")
    return FolderImages(name=name, split=split, task="zeroshot_classification",
                        labels=np.asarray(labels[:limit], dtype=np.int64), prompts=prompts, paths=paths[:limit],
                        root=folder, layout="caltech101")


def load_class_folders(name: str, folder: Path, split: str, limit: int | None, prompts: ClassPrompts,
                       source: str) -> FolderImages:
    """torchvision's ImageFolder on ``folder``: classes the sorted sub-folders, named by clip_benchmark's list."""
    if not folder.is_dir():
        raise DatasetError(f"dataset {name!r}: {folder} not found (files: {source})")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if len(classes) != len(prompts.classnames):
        raise DatasetError(f"dataset {name!r}: {folder} has {len(classes)} class folders, clip_benchmark names "
                           f"{len(prompts.classnames)} classes for it ({', '.join(prompts.classnames)})")
    paths, labels = images_by_class(folder, classes)
    if not paths:
        raise DatasetError(f"dataset {name!r}: no images under {folder}/<class>/")
    return FolderImages(name=name, split=split, task="zeroshot_classification",
                        labels=np.asarray(labels[:limit], dtype=np.int64), prompts=prompts, paths=paths[:limit],
                        root=folder, layout="imagefolder")


# -- ObjectNet: objectnet-1.0/images/<folder>/ + the mapping files clip_benchmark copies beside it ----------------------
OBJECTNET_MAPS = ("folder_to_objectnet_label.json", "objectnet_to_imagenet_1k.json")


def load_objectnet(name: str, root: Path, split: str, limit: int | None, source: str) -> FolderImages:
    """clip_benchmark's ObjectNetDataset: the 113 ObjectNet classes that map to ImageNet-1k classes
    (``objectnet_to_imagenet_1k.json``), each the image folder ``folder_to_objectnet_label.json`` names for it;
    classes in sorted folder order, named by their ObjectNet label in lower case; images in ImageFolder's order."""
    root = Path(root)
    maps = []
    for file in OBJECTNET_MAPS:
        path = root / file
        if not path.is_file():
            raise DatasetError(f"dataset {name!r}: {path} not found (clip_benchmark copies objectnet-1.0/mappings/* "
                               f"beside objectnet-1.0/; files: {source})")
        try:
            maps.append(json.loads(path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DatasetError(f"{path}: not a JSON object ({e})") from e
    folder_to_label, to_imagenet = maps
    label_to_folder = {label: folder for folder, label in folder_to_label.items()}
    unknown = [label for label in to_imagenet if label not in label_to_folder]
    if unknown:
        raise DatasetError(f"dataset {name!r}: {root / OBJECTNET_MAPS[1]} names {unknown[0]!r}, which "
                           f"{OBJECTNET_MAPS[0]} has no folder for")
    folders = sorted(label_to_folder[label] for label in to_imagenet)
    images = root / "objectnet-1.0" / "images"
    paths, labels = images_by_class(images, folders)
    if not paths:
        raise DatasetError(f"dataset {name!r}: no images under {images}/<folder>/ (files: {source})")
    prompts = ClassPrompts([folder_to_label[f].lower() for f in folders], templates_for(name, "en"), "en",
                           str(root))
    return FolderImages(name=name, split=split, task="zeroshot_classification",
                        labels=np.asarray(labels[:limit], dtype=np.int64), prompts=prompts, paths=paths[:limit],
                        root=images, layout="objectnet")


# -- PASCAL VOC 2007: VOCdevkit/VOC2007/{ImageSets/Main,Annotations,JPEGImages} ----------------------------------------
VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")


@dataclass
class VocImages(FolderImages):
    """One sample per image (multilabel) or per annotated object, cropped to its box (voc2007)."""

    boxes: list[tuple[int, int, int, int]] | None = None

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        from clipcache.storage.hashing import digest

        unique = sorted(set(self.paths))
        boxes: list[Any] = list(self.boxes) if self.boxes else [None] * len(self.paths)
        return {"format": self.layout, "images": memo.fingerprint(unique, root=self.root),
                "samples": digest([[str(p.relative_to(self.root)), list(b) if b else None]
                                   for p, b in zip(self.paths, boxes, strict=True)]),
                "labels": digest(np.asarray(self.labels).tolist())}

    def describe(self, index: int) -> str:
        box = f" (object box {self.boxes[index]})" if self.boxes else ""
        return f"{self.paths[index]}{box}"

    def sample_key(self, index: int) -> str:  # an image holds several objects: its box tells them apart
        box = "#" + ",".join(map(str, self.boxes[index])) if self.boxes else ""
        return relative_name(self.paths[index], self.root) + box

    def read_image_bytes(self, index: int) -> bytes | Image.Image:
        if not self.boxes:
            return self.paths[index].read_bytes()
        try:
            with Image.open(self.paths[index]) as img:
                return img.convert("RGB").crop(self.boxes[index])
        except Exception as e:  # PIL raises many types for bad data
            raise DatasetError(f"image does not decode: {self.describe(index)} ({type(e).__name__}: {e})") from e


def load_voc2007(name: str, root: Path, split: str, limit: int | None, source: str) -> VocImages:
    """clip_benchmark's PASCALVoc2007 (``voc2007_multilabel``: each image with the multi-hot set of its objects'
    classes) and PASCALVoc2007Cropped (``voc2007``: each object, in annotation order, its box cropped out): image ids
    from ``ImageSets/Main/aeroplane_<split>.txt``, objects from ``Annotations/<id>.xml``."""
    import xml.etree.ElementTree as ET

    base = Path(root) / "VOCdevkit" / "VOC2007"
    index_file = base / "ImageSets" / "Main" / f"aeroplane_{split}.txt"
    if not index_file.is_file():
        raise DatasetError(f"dataset {name!r}: {index_file} not found (files: {source})")
    ids = [line.split()[0] for line in index_file.read_text(encoding="utf-8").splitlines() if line.split()]
    category = {c: i for i, c in enumerate(VOC_CLASSES)}
    objects: list[tuple[str, tuple[int, int, int, int], int]] = []
    for image_id in ids:
        xml = base / "Annotations" / f"{image_id}.xml"
        try:
            tree = ET.parse(xml)
            for obj in tree.findall("object"):
                box, label = obj.find("bndbox"), obj.findtext("name") or ""
                if label not in category or box is None:
                    raise ValueError(f"an object with name {label!r} (not a VOC class) or no bndbox")
                coords = tuple(int(box.findtext(k) or "") for k in ("xmin", "ymin", "xmax", "ymax"))
                objects.append((image_id, (coords[0], coords[1], coords[2], coords[3]), category[label]))
        except (OSError, ET.ParseError, ValueError) as e:
            raise DatasetError(f"dataset {name!r}: {xml} cannot be read ({type(e).__name__}: {e})") from e
    images = base / "JPEGImages"
    prompts = ClassPrompts(list(VOC_CLASSES), templates_for(name, "en"), "en", str(base))
    if name == "voc2007_multilabel":
        labels = np.zeros((len(ids), len(VOC_CLASSES)), dtype=np.uint8)
        row = {image_id: i for i, image_id in enumerate(ids)}
        for image_id, _, c in objects:
            labels[row[image_id], c] = 1
        paths = [images / f"{image_id}.jpg" for image_id in ids]
        return VocImages(name=name, split=split, task="zeroshot_classification", labels=labels[:limit],
                         prompts=prompts, multilabel=True, paths=paths[:limit], root=images,
                         layout="voc2007-multilabel")
    items = objects[:limit]
    return VocImages(name=name, split=split, task="zeroshot_classification",
                     labels=np.asarray([c for _, _, c in items], dtype=np.int64), prompts=prompts,
                     paths=[images / f"{image_id}.jpg" for image_id, _, _ in items], root=images,
                     layout="voc2007-cropped", boxes=[box for _, box, _ in items])
