"""clip_benchmark's original layouts: the table (layouts.json) and the readers it names.

Each dataset of clip_benchmark's builder that it reads from files of the original distribution has one entry in
``layouts.json``: its reader, the folder it lives in under ``--dataset_root``, its splits, where its class names come
from and where clip_benchmark gets the files. Readers are shared: one reads every torchvision-backed set, one every
ImageNet-style class-folder set, one every multilingual caption file. Adding a dataset whose layout an existing
reader knows is one entry in the table; a new layout is a reader function here plus an entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset

TABLE = Path(__file__).with_name("layouts.json")
SETS = Path(__file__).with_name("prompts") / "clip_benchmark_sets.json"


@cache
def layouts() -> dict[str, dict[str, Any]]:
    table = {k: v for k, v in _table().items() if not k.startswith("_")}
    for name, facts in dataset_facts()["multilingual_retrieval"].items():
        table[name] = {"reader": "captions_json", "folder": facts["file"], "splits": ["test"],
                       "languages": facts["languages"], "maker": f"{facts['module']}.create_annotation_file",
                       "source": f"clip_benchmark's {name} annotation files, made by "
                                 f"{facts['module']}.create_annotation_file"}
    return table


@cache
def _table() -> dict[str, Any]:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def not_read() -> dict[str, str]:
    """Names of clip_benchmark's builder that clipcache does not read from their original files, and why."""
    return dict(_table()["_not_read"])


@cache
def dataset_facts() -> dict[str, Any]:
    return json.loads(SETS.read_text(encoding="utf-8"))


def annotation_datasets() -> list[str]:
    """The datasets whose caption file --annotation_file can replace (the caption sets' readers take one)."""
    return [name for name, entry in layouts().items() if entry["reader"] in RETRIEVAL_READERS]


def task_of(name: str) -> str:
    return "zeroshot_retrieval" if layouts()[name]["reader"] in RETRIEVAL_READERS else "zeroshot_classification"


def describe(name: str) -> str:
    """One line for ``clipcache datasets``: the layout under --dataset_root."""
    entry = layouts()[name]
    what = f"torchvision {entry['class']}" if entry["reader"] == "torchvision" else READER_LABELS[entry["reader"]]
    return f"{what}: {entry['folder']}"


def languages_of(name: str) -> list[str] | None:
    """The languages clip_benchmark has ``name`` in (class names or captions), None for names not in the table."""
    from clipcache.tasks.datasets.imagenet_layouts import babel_languages
    from clipcache.tasks.datasets.languages import languages

    entry = layouts().get(name)
    if entry is None:
        return None
    if "languages" in entry:
        return list(entry["languages"])
    if entry.get("classnames") == "babel":
        return list(babel_languages())
    if entry["reader"] in RETRIEVAL_READERS:
        return ["en"]
    return languages() if str(entry.get("classnames", "")).startswith("imagenet1k") else ["en"]


def check_split(name: str, split: str) -> None:
    splits = layouts()[name]["splits"]
    if splits is not None and split not in splits and not (split == "val" and "test" in splits
                                                           and layouts()[name]["reader"] in ("imagenet", "babel")):
        raise DatasetError(f"dataset {name!r} has the splits {', '.join(splits)} (asked for {split!r})")


def english_prompts(name: str, own: list[str], where: str) -> ClassPrompts:
    """The English class names clip_benchmark uses for ``name`` (its own files, torchvision's class list, or its
    shipped lists) with its templates for the dataset (else its ImageNet ones)."""
    from clipcache.tasks.datasets.original import clip_benchmark_prompts, imagenet_wnids, templates_for

    kind, _, arg = layouts()[name]["classnames"].partition(":")
    if kind in ("torchvision", "files"):
        names = list(own)
        for ch in arg:
            names = [n.replace(ch, " ") for n in names]
    elif kind == "clip_benchmark":
        names = list(clip_benchmark_prompts()["en"]["classnames"][arg or name])
    else:  # imagenet1k, optionally one of the variants' 200-class subsets
        names = list(clip_benchmark_prompts()["en"]["classnames"]["imagenet1k"])
        if arg:
            keep = set(dataset_facts()["imagenet_subsets"][arg])
            names = [n for n, w in zip(names, imagenet_wnids(), strict=True) if w in keep]
    return ClassPrompts(names, templates_for(name, "en"), "en", where)


def present(name: str, root: Path, split: str) -> bool:
    """Whether ``root`` holds ``name`` in its original layout (rather than webdataset shards)."""
    from clipcache.tasks.datasets import imagenet_layouts, original_captions

    entry, root = layouts()[name], Path(root)
    reader = entry["reader"]
    if reader in ("imagenet", "babel"):
        return imagenet_layouts.is_imagenet_folder(root, split)
    if reader == "wnid_folder":
        return imagenet_layouts.has_wnid_folders(root)
    if reader == "flickr":
        return original_captions.is_flickr_folder(name, root)
    if reader == "coco":
        return any(root.glob("coco_*_karpathy.json")) or (root / "val2014").is_dir()
    if reader == "captions_json":
        return any(root.glob(entry["folder"].format(language="*")))
    if reader == "imagefolder":  # class folders, not a webdataset split folder (<split>/nshards.txt)
        folder = root / ("train" if split == "train" else "test")
        return folder.is_dir() and not (folder / "nshards.txt").exists() and any(p.is_dir() for p in folder.iterdir())
    return (root / entry["folder"].split("/")[0].format(split=split)).exists()


def open_original(name: str, root: Path, split: str, limit: int | None, *, language: str = "en",
                  annotation_file: str | None = None) -> EvalDataset:
    check_split(name, split)
    entry = layouts()[name]
    reader = READERS[entry["reader"]]
    return reader(name, entry, Path(root), split, limit, language=language, annotation_file=annotation_file)


def _torchvision(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.torchvision_sets import load_torchvision

    folder = root / entry["folder"].format(split=split)
    return load_torchvision(name, entry, root, split, limit, lambda own: english_prompts(name, own, str(folder)))


def _cifar(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.original import load_cifar

    return load_cifar(name, root, split, limit)


def _imagenet(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.imagenet_layouts import load_imagenet_folder

    return load_imagenet_folder(name, root, split, limit)


def _wnid_folder(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.imagenet_layouts import load_wnid_folder

    subset = entry["classnames"].partition(":")[2]
    return load_wnid_folder(name, root, split, limit, dataset_facts()["imagenet_subsets"][subset] if subset else None,
                            english_prompts(name, [], str(root)))


def _babel(name, entry, root, split, limit, *, language="en", **_):
    from clipcache.tasks.datasets.imagenet_layouts import load_babel_imagenet

    return load_babel_imagenet(name, root, split, limit, language)


def _objectnet(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.original import load_objectnet

    return load_objectnet(name, root, split, limit, entry["source"])


def _voc2007(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.original import load_voc2007

    return load_voc2007(name, root, split, limit, entry["source"])


def _imagenetv2(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.imagenet_layouts import load_imagenetv2

    return load_imagenetv2(name, root, split, limit, english_prompts(name, [], str(root)))


def _caltech101(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.original import load_caltech101

    return load_caltech101(name, root, split, limit, english_prompts(name, [], str(root)), entry["source"])


def _imagefolder(name, entry, root, split, limit, **_):
    from clipcache.tasks.datasets.original import load_class_folders

    folder = root / ("train" if split == "train" else "test")
    return load_class_folders(name, folder, split, limit, english_prompts(name, [], str(folder)), entry["source"])


def _flickr(name, entry, root, split, limit, *, language="en", annotation_file=None):
    from clipcache.tasks.datasets.original_captions import load_flickr

    return load_flickr(name, root, split, limit, language=language, annotation_file=annotation_file)


def _coco(name, entry, root, split, limit, *, language="en", annotation_file=None):
    from clipcache.tasks.datasets.original_captions import load_coco_karpathy

    return load_coco_karpathy(name, root, split, limit, language=language, annotation_file=annotation_file)


def _captions_json(name, entry, root, split, limit, *, language="en", annotation_file=None):
    from clipcache.tasks.datasets.original_captions import load_captions_json

    return load_captions_json(name, root, split, limit, entry, language=language, annotation_file=annotation_file)


READERS: dict[str, Callable[..., EvalDataset]] = {
    "torchvision": _torchvision, "cifar": _cifar, "imagenet": _imagenet, "wnid_folder": _wnid_folder,
    "imagenetv2": _imagenetv2, "babel": _babel, "objectnet": _objectnet, "voc2007": _voc2007,
    "caltech101": _caltech101, "imagefolder": _imagefolder, "flickr": _flickr,
    "coco": _coco, "captions_json": _captions_json,
}
RETRIEVAL_READERS = ("flickr", "coco", "captions_json")
READER_LABELS = {"cifar": "torchvision pickles", "imagenet": "ImageNet folders", "wnid_folder": "WordNet-id folders",
                 "imagenetv2": "ImageNetV2 folders", "babel": "ImageNet folders", "objectnet": "ObjectNet folders",
                 "voc2007": "VOCdevkit", "caltech101": "101_ObjectCategories", "imagefolder": "class folders",
                 "flickr": "Karpathy captions", "coco": "COCO Karpathy JSON", "captions_json": "caption JSON"}
