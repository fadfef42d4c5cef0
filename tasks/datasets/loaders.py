"""Registry entry points (kept tiny; each module holds its format)."""

from __future__ import annotations

from pathlib import Path

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import EvalDataset


def shapes_classification(name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
    from clipcache.tasks.datasets.shapes import load_shapes

    return load_shapes(name, "zeroshot_classification", split, limit)


def shapes_retrieval(name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
    from clipcache.tasks.datasets.shapes import load_shapes

    return load_shapes(name, "zeroshot_retrieval", split, limit)


def custom(name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
    from clipcache.tasks.datasets.custom import load_image_queries

    if root is None:
        raise DatasetError("dataset 'custom' needs data_dir (or --dataset_root): the folder holding image_queries.jsonl")
    return load_image_queries(name, root, split, limit)


def _root(name: str, root: Path | None) -> Path:
    if root is None:
        raise DatasetError(f"dataset {name!r} needs --dataset_root (or data_dir): the folder holding the data")
    return root


def imagefolder(name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
    from clipcache.tasks.datasets.labelled import load_imagefolder

    return load_imagefolder(name, _root(name, root), split, limit)


def image_labels(name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
    from clipcache.tasks.datasets.labelled import load_image_labels

    return load_image_labels(name, _root(name, root), split, limit)


def sugar_crepe(name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
    from clipcache.tasks.datasets.selection import load_sugar_crepe

    return load_sugar_crepe(name, _root(name, root), split, limit)


def winoground(name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
    from clipcache.tasks.datasets.selection import load_winoground

    return load_winoground(name, _root(name, root), split, limit)

