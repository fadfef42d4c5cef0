"""clip_benchmark's original layouts: the table (layouts.json) and the lookups over it.

Each dataset of clip_benchmark's builder that it reads from files of the original distribution has one entry in
``layouts.json``: its reader, the folder it lives in under ``--dataset_root``, its splits, where its class names come
from and where clip_benchmark gets the files. Readers are shared: one reads every torchvision-backed set, one every
ImageNet-style class-folder set, one every multilingual caption file. What a reader is (how its files are found and
read, its task, its label) is one row of ``READERS`` in tasks/datasets/clip_benchmark/layout_readers.py. Adding a
dataset whose layout an existing reader knows is one entry in the table; a new layout is a row in ``READERS`` plus its
entries.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import DatasetError

if TYPE_CHECKING:  # naming datasets must not import numpy (base) or the readers
    from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset
    from clipcache.tasks.datasets.clip_benchmark.layout_readers import LayoutReader

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


def reader_of(name: str) -> LayoutReader:
    """The reader description of ``name``'s layout (layouts.json's ``reader``, a row of layout_readers.READERS)."""
    from clipcache.tasks.datasets.clip_benchmark.layout_readers import READERS

    return READERS[layouts()[name]["reader"]]


def annotation_datasets() -> list[str]:
    """The datasets whose caption file --annotation_file can replace (the caption sets' readers take one)."""
    return [name for name in layouts() if reader_of(name).task == "zeroshot_retrieval"]


def task_of(name: str) -> str:
    return reader_of(name).task


def describe(name: str) -> str:
    """One line for ``clipcache datasets``: the layout under --dataset_root."""
    entry = layouts()[name]
    return f"{reader_of(name).describe(entry)}: {entry['folder']}"


def languages_of(name: str) -> list[str] | None:
    """The languages clip_benchmark has ``name`` in (class names or captions), None for names not in the table."""
    entry = layouts().get(name)
    if entry is None:
        return None
    if "languages" in entry:
        return list(entry["languages"])
    if entry.get("classnames") == "babel":
        from clipcache.tasks.datasets.clip_benchmark.imagenet_layouts import babel_languages

        return list(babel_languages())
    if reader_of(name).task == "zeroshot_retrieval":
        return ["en"]
    if str(entry.get("classnames", "")).startswith("imagenet1k"):
        from clipcache.tasks.datasets.clip_benchmark.languages import languages

        return languages()
    return ["en"]


def check_split(name: str, split: str) -> None:
    splits = layouts()[name]["splits"]
    if splits is not None and split not in splits and not (split == "val" and "test" in splits
                                                           and reader_of(name).val_reads_test):
        raise DatasetError(f"dataset {name!r} has the splits {', '.join(splits)} (asked for {split!r})")


def english_prompts(name: str, own: list[str], where: str) -> ClassPrompts:
    """The English class names clip_benchmark uses for ``name`` (its own files, torchvision's class list, or its
    shipped lists) with its templates for the dataset (else its ImageNet ones)."""
    from clipcache.tasks.datasets.base import ClassPrompts
    from clipcache.tasks.datasets.clip_benchmark.original import clip_benchmark_prompts, imagenet_wnids, templates_for

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
    return reader_of(name).present(name, layouts()[name], Path(root), split)


def open_original(name: str, root: Path, split: str, limit: int | None, *, language: str = "en",
                  annotation_file: str | None = None) -> EvalDataset:
    check_split(name, split)
    return reader_of(name).read(name, layouts()[name], Path(root), split, limit, language=language,
                                annotation_file=annotation_file)
