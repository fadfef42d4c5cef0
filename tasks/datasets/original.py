"""clip_benchmark's original (torchvision) layouts under ``--dataset_root``, read as clip_benchmark reads them.

- ``cifar10``: ``<root>/cifar-10-batches-py/`` (``data_batch_1`` .. ``data_batch_5``, ``test_batch``,
  ``batches.meta``); ``cifar100``: ``<root>/cifar-100-python/`` (``train``, ``test``, ``meta``). Python pickles of
  3,072-byte rows (3 x 32 x 32, channel-major), as torchvision's CIFAR10/CIFAR100 read them: rows in file order,
  the train split the five batches in order. Class names are the files' own (``label_names`` / ``fine_label_names``),
  as clip_benchmark keeps torchvision's; templates are clip_benchmark's for the dataset in the chosen language
  (tasks/datasets/prompts/clip_benchmark.json), falling back to its ImageNet templates as it does.

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
from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset

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
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")  # noqa: S301 - the user's own dataset files, as torchvision
    except (pickle.UnpicklingError, EOFError, ValueError, OSError) as e:
        raise DatasetError(f"dataset {name!r}: {path} is not a CIFAR pickle ({type(e).__name__}: {e})") from e


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


# -- ImageNet-1k: torchvision's ImageNet layout (meta.bin + val/<wnid>/) or a plain val/<wnid>/ folder -----------------
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

    def read_image_bytes(self, index: int) -> bytes:
        return self.paths[index].read_bytes()


def is_imagenet_folder(root: Path, split: str) -> bool:
    folder = Path(root) / ("train" if split == "train" else "val")
    known = set(imagenet_wnids())
    return folder.is_dir() and any(p.is_dir() and p.name in known for p in folder.iterdir())


def load_imagenet_folder(name: str, root: Path, split: str, limit: int | None) -> FolderImages:
    """Images in ImageFolder's order (classes by sorted WordNet id, files sorted within each), labels the class index
    of each folder's WordNet id among the 1,000; clip_benchmark's 1,000 class names and its ImageNet templates.
    clip_benchmark's ``test`` split is torchvision's ``val`` folder (its ``train`` the ``train`` folder)."""
    from clipcache.tasks.datasets.languages import imagenet_prompts

    folder = Path(root) / ("train" if split == "train" else "val")
    if split not in ("train", "test", "val"):
        raise DatasetError(f"dataset {name!r} has the splits train and test (val/) (asked for {split!r})")
    index = {w: i for i, w in enumerate(imagenet_wnids())}
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    unknown = [c for c in classes if c not in index]
    if unknown:
        raise DatasetError(f"dataset {name!r}: {folder / unknown[0]} is not an ImageNet-1k WordNet id folder "
                           f"(expected n01440764 ... n15075141)")
    paths: list[Path] = []
    labels: list[int] = []
    for wnid in classes:
        files = sorted(f for f in (folder / wnid).iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file())
        paths += files
        labels += [index[wnid]] * len(files)
        if limit is not None and len(paths) >= limit:
            break
    if not paths:
        raise DatasetError(f"dataset {name!r}: no images under {folder}/<wnid>/")
    en = imagenet_prompts()["en"]
    prompts = ClassPrompts(list(en["classnames"]), list(en["templates"]), "en", str(folder))
    return FolderImages(name=name, split=split, task="zeroshot_classification",
                        labels=np.asarray(labels[:limit], dtype=np.int64), prompts=prompts, paths=paths[:limit],
                        root=folder, layout="imagenet-folder", languages=tuple(sorted(imagenet_prompts())))


# -- Flickr30k / Flickr8k: images + clip_benchmark's Karpathy-split caption files --------------------------------------
FLICKR_ANNOTATIONS = "https://github.com/mehdidc/retrieval_annotations/releases/download/1.0.0/{file}"
FLICKR_FILES = {"en": "{name}_{split}_karpathy.txt", "zh": "{name}_{split}_zh.txt"}


def is_flickr_folder(name: str, root: Path) -> bool:
    return any(Path(root).glob(f"{name}_*_karpathy.txt")) or any(Path(root).glob(f"{name}_*_zh.txt"))


@dataclass
class CaptionedImages(FolderImages):
    annotation: Path = Path(".")

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {**super().identity(memo), "captions": memo.sha256(self.annotation)}


def load_flickr(name: str, root: Path, split: str, limit: int | None, *, language: str = "en") -> CaptionedImages:
    """clip_benchmark's Flickr reader: a header line, then ``<image>.jpg,<caption>`` lines (split at the first
    ``.jpg,``); images in the order they first appear, each with its captions in file order; images under root."""
    root = Path(root)
    if language not in FLICKR_FILES:
        raise DatasetError(f"language: {language!r} is not available for dataset {name!r} (available: "
                           f"{', '.join(FLICKR_FILES)})")
    file = FLICKR_FILES[language].format(name=name, split=split)
    annotation = root / file
    if not annotation.is_file():
        raise DatasetError(f"dataset {name!r}: {annotation} not found (clip_benchmark downloads it from "
                           f"{FLICKR_ANNOTATIONS.format(file=file)})")
    captions: dict[str, list[str]] = {}
    try:
        lines = annotation.read_text(encoding="utf-8").splitlines()[1:]
    except UnicodeDecodeError as e:
        raise DatasetError(f"{annotation}: not UTF-8 text (byte {e.start + 1})") from e
    for n, line in enumerate(lines, start=2):
        line = line.strip()
        if not line:
            continue
        image, sep, caption = line.partition(".jpg,")
        if not sep:
            raise DatasetError(f"{annotation} line {n}: expected <image>.jpg,<caption>")
        captions.setdefault(image + ".jpg", []).append(caption)
    items = list(captions.items())[:limit]
    paths = [root / image for image, _ in items]
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:
        raise DatasetError(f"dataset {name!r}: image {missing} (named in {annotation.name}) not found")
    if not items:
        raise DatasetError(f"dataset {name!r}: {annotation} lists no images")
    languages = tuple(lang for lang, pattern in FLICKR_FILES.items()
                      if (root / pattern.format(name=name, split=split)).is_file())
    return CaptionedImages(name=name, split=split, task="zeroshot_retrieval", captions=[c for _, c in items],
                           paths=paths, root=root, layout=f"flickr-{language}", annotation=annotation,
                           languages=languages)
