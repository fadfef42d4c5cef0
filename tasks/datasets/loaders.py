"""The built-in dataset readers registered by name in ``DATASETS`` (kept tiny; each module holds its format). Each is
a :class:`DatasetReader` that declares its task, as a plugin's reader does, so ``--task auto`` knows it before the
data is read."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.reader import DatasetReader

if TYPE_CHECKING:
    from clipcache.tasks.datasets.base import EvalDataset


def _root(name: str, root: Path | None) -> Path:
    if root is None:
        raise DatasetError(f"dataset {name!r} needs --dataset_root (or data_dir): the folder holding the data")
    return root


class ShapesClassification(DatasetReader):
    task = "zeroshot_classification"
    description = "bundled: 30 generated shape classes"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.shapes import load_shapes

        return load_shapes(name, "zeroshot_classification", split, limit)


class ShapesRetrieval(DatasetReader):
    task = "zeroshot_retrieval"
    description = "bundled: generated shapes with captions"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.shapes import load_shapes

        return load_shapes(name, "zeroshot_retrieval", split, limit)


class ImageQueries(DatasetReader):
    task = "zeroshot_retrieval"
    description = "evalscope's image_queries.jsonl"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.custom import load_image_queries

        if root is None:
            raise DatasetError("dataset 'custom' needs data_dir (or --dataset_root): the folder holding "
                               "image_queries.jsonl")
        return load_image_queries(name, root, split, limit)


class ImageFolder(DatasetReader):
    task = "zeroshot_classification"
    description = "your <class>/<image> folders"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.labelled import load_imagefolder

        return load_imagefolder(name, _root(name, root), split, limit)


class ImageLabels(DatasetReader):
    task = "zeroshot_classification"
    description = "your image_labels.csv or .jsonl + classnames.txt"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.labelled import load_image_labels

        return load_image_labels(name, _root(name, root), split, limit)


class SugarCrepe(DatasetReader):
    task = "image_caption_selection"
    description = "SugarCrepe: val2017/ + <task>.json (clip_benchmark's layout)"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.selection import load_sugar_crepe

        return load_sugar_crepe(name, _root(name, root), split, limit)


class Winoground(DatasetReader):
    task = "image_caption_selection"
    description = "the datasets cache of facebook/winoground, or its Parquet files"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.selection import load_winoground

        return load_winoground(name, _root(name, root), split, limit)


class AroVisualGenome(DatasetReader):
    task = "image_caption_selection"
    description = "ARO's VG-Relation / VG-Attribution: images/ + visual_genome_<relation|attribution>.json"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.compositionality.compositionality import load_aro_vg

        return load_aro_vg(name, _root(name, root), split, limit)


class AroOrder(DatasetReader):
    task = "image_caption_selection"
    description = "ARO's COCO-Order / Flickr30k-Order: its test cases (<set>_<split>.json) + the images"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.compositionality.compositionality import load_aro_order

        return load_aro_order(name, _root(name, root), split, limit)


class Valse(DatasetReader):
    task = "image_caption_selection"
    description = "a VALSE piece: <piece>.json + images/ (valid items, caption vs foil)"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.compositionality.compositionality import load_valse

        return load_valse(name, _root(name, root), split, limit)


class MmvpVlm(DatasetReader):
    task = "image_caption_selection"
    description = "MMVP-VLM: Questions.csv + MLLM_VLM Images/ (pair accuracy in image_acc)"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        from clipcache.tasks.datasets.compositionality.compositionality import load_mmvp_vlm

        return load_mmvp_vlm(name, _root(name, root), split, limit)
