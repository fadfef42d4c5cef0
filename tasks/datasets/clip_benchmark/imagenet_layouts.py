"""clip_benchmark's ImageNet-family layouts: class folders named by WordNet id.

- ``imagenet1k`` / ``imagenet1k-unverified``: ``val/<wnid>/`` (``train/<wnid>/``), with or without torchvision's
  ``meta.bin``.
- ``imagenet_sketch``, ``imagenet-a`` / ``-r`` / ``-o``: the root holds ``<wnid>/`` folders (the variants' 200-class
  subsets as clip_benchmark applies them).
- ``imagenetv2``: ``ImageNetV2-matched-frequency/<class index>/*.jpeg``.
- ``babel_imagenet``: ImageNet's folders restricted to the classes Babel-ImageNet names in a language.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import ClassPrompts
from clipcache.tasks.datasets.clip_benchmark.original import FolderImages, folder_images, imagenet_wnids


def is_imagenet_folder(root: Path, split: str) -> bool:
    return has_wnid_folders(Path(root) / ("train" if split == "train" else "val"))


def has_wnid_folders(folder: Path) -> bool:
    known = set(imagenet_wnids())
    return Path(folder).is_dir() and any(p.is_dir() and p.name in known for p in Path(folder).iterdir())


def load_wnid_folder(name: str, folder: Path, split: str, limit: int | None, *, subset: list[str] | None,
                     prompts: ClassPrompts, layout: str = "wnid-folder") -> FolderImages:
    """Class folders named by WordNet id (``<folder>/<wnid>/...``), in ImageFolder's order; a folder's label is its
    id's index among ``subset`` (the 200 of imagenet-a/-r/-o) or the 1,000, so a copy with some class folders
    missing keeps every other class's index (ImageFolder would shift them)."""
    from clipcache.tasks.datasets.clip_benchmark.languages import imagenet_prompts

    folder = Path(folder)
    wnids = subset if subset is not None else imagenet_wnids()
    index = {w: i for i, w in enumerate(wnids)}
    if not folder.is_dir():
        raise DatasetError(f"dataset {name!r}: {folder} not found (expected {folder}/<wnid>/ image folders)")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    unknown = [c for c in classes if c not in index]
    if unknown:
        which = f"one of the {len(wnids)} WordNet ids of {name}" if subset is not None else \
            "an ImageNet-1k WordNet id folder (expected n01440764 ... n15075141)"
        raise DatasetError(f"dataset {name!r}: {folder / unknown[0]} is not {which}")
    paths: list[Path] = []
    labels: list[int] = []
    for wnid in classes:
        files = folder_images(folder / wnid)
        paths += files
        labels += [index[wnid]] * len(files)
        if limit is not None and len(paths) >= limit:
            break
    if not paths:
        raise DatasetError(f"dataset {name!r}: no images under {folder}/<wnid>/")
    return FolderImages(name=name, split=split, task="zeroshot_classification",
                        labels=np.asarray(labels[:limit], dtype=np.int64), prompts=prompts, paths=paths[:limit],
                        root=folder, layout=layout, languages=tuple(sorted(imagenet_prompts())))


def load_imagenet_folder(name: str, root: Path, split: str, limit: int | None) -> FolderImages:
    """torchvision's ImageNet layout (``meta.bin`` + ``val/<wnid>/``) or a plain ``val/<wnid>/``: clip_benchmark's
    ``test`` split is the ``val`` folder, its ``train`` the ``train`` folder; its 1,000 class names and ImageNet
    templates."""
    from clipcache.tasks.datasets.clip_benchmark.languages import imagenet_prompts

    if split not in ("train", "test", "val"):
        raise DatasetError(f"dataset {name!r} has the splits train and test (val/) (asked for {split!r})")
    folder = Path(root) / ("train" if split == "train" else "val")
    en = imagenet_prompts()["en"]
    prompts = ClassPrompts(list(en["classnames"]), list(en["templates"]), "en", str(folder))
    return load_wnid_folder(name, folder, split, limit, subset=None, prompts=prompts, layout="imagenet-folder")


def load_imagenetv2(name: str, root: Path, split: str, limit: int | None, prompts: ClassPrompts) -> FolderImages:
    """ImageNetV2 (matched frequency): ``ImageNetV2-matched-frequency/<class index>/*.jpeg``, the folder name the
    label. clip_benchmark lists the files in glob order (the file system's); clipcache sorts them, which no metric
    of a classification sees."""
    from clipcache.tasks.datasets.clip_benchmark.languages import imagenet_prompts

    folder = Path(root) / "ImageNetV2-matched-frequency"
    if not folder.is_dir():
        raise DatasetError(f"dataset {name!r}: {folder} not found (clip_benchmark downloads "
                           f"imagenetv2-matched-frequency.tar.gz and unpacks it there)")
    paths = sorted(folder.glob("**/*.jpeg"), key=lambda p: (p.parent.name, p.name))
    labels = []
    for p in paths:
        if not (p.parent.name.isdigit() and 0 <= int(p.parent.name) < len(prompts.classnames)):
            raise DatasetError(f"dataset {name!r}: {p} is not in a class folder 0 ... "
                               f"{len(prompts.classnames) - 1}")
        labels.append(int(p.parent.name))
    if not paths:
        raise DatasetError(f"dataset {name!r}: no .jpeg images under {folder}/<class index>/")
    return FolderImages(name=name, split=split, task="zeroshot_classification",
                        labels=np.asarray(labels[:limit], dtype=np.int64), prompts=prompts, paths=paths[:limit],
                        root=folder, layout="imagenetv2", languages=tuple(sorted(imagenet_prompts())))


BABEL = Path(__file__).with_name("prompts") / "babel_imagenet.json"


@cache
def babel_languages() -> dict[str, dict[str, Any]]:
    return dict(json.loads(BABEL.read_text(encoding="utf-8"))["languages"])


def load_babel_imagenet(name: str, root: Path, split: str, limit: int | None, language: str) -> FolderImages:
    """Babel-ImageNet: ImageNet's ``val/<wnid>/`` (``train/`` for the train split) restricted to the classes
    Babel-ImageNet names in ``language``, class by class in its order, labelled by position in that list; its class
    names and NLLB-translated templates (tasks/datasets/clip_benchmark/prompts/babel_imagenet.json)."""
    data = babel_languages().get(language.lower())
    if data is None:
        raise DatasetError(f"language: {language!r} is not available for dataset {name!r} (available: "
                           f"{', '.join(list(babel_languages())[:15])}, ... {len(babel_languages())} in all)")
    full = load_imagenet_folder(name, root, split, None)
    by_class: dict[int, list[Path]] = {}
    for path, label in zip(full.paths, np.asarray(full.labels).tolist(), strict=True):
        by_class.setdefault(label, []).append(path)
    paths: list[Path] = []
    labels: list[int] = []
    for position, index in enumerate(data["indices"]):
        paths += by_class.get(index, [])
        labels += [position] * len(by_class.get(index, []))
    if not paths:
        raise DatasetError(f"dataset {name!r}: none of the {len(data['indices'])} classes Babel-ImageNet has in "
                           f"{language!r} has images under {full.root}")
    prompts = ClassPrompts(list(data["classnames"]), list(data["templates"]), language, f"{BABEL.name} ({language})")
    return FolderImages(name=name, split=split, task="zeroshot_classification",
                        labels=np.asarray(labels[:limit], dtype=np.int64), prompts=prompts, paths=paths[:limit],
                        root=full.root, layout="babel-imagenet", languages=tuple(babel_languages()))
