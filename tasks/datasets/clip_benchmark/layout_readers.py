"""The kinds of clip_benchmark original layout, as one table: ``READERS`` maps the ``reader`` of a layouts.json entry
to a :class:`LayoutReader`, which says everything clipcache knows about that kind of files: how to tell whether a
``--dataset_root`` holds them (rather than webdataset shards), how to read them, the task they serve, and what
``clipcache datasets`` calls them.

A new original layout is one ``LayoutReader`` here (its read function may sit in a module of its own, imported
inside it) plus one entry per dataset in layouts.json, and a fixture in tests/layout_fixtures.py for the parity test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.tasks.datasets.clip_benchmark.layouts import dataset_facts, english_prompts

if TYPE_CHECKING:
    from clipcache.tasks.datasets.base import EvalDataset

Entry = dict[str, Any]  # a dataset's entry in layouts.json


def top_folder_present(name: str, entry: Entry, root: Path, split: str) -> bool:
    """The default test: the first folder of the entry's ``folder`` (``{split}`` filled in) exists under the root."""
    return (root / entry["folder"].split("/")[0].format(split=split)).exists()


@dataclass(frozen=True)
class LayoutReader:
    """One kind of original layout, shared by every layouts.json entry that names it."""

    label: str  # what `clipcache datasets` calls the files; {field}s are filled from the entry ("torchvision {class}")
    # (name, entry, root, split, limit, *, language, annotation_file) -> the indexed dataset
    read: Callable[..., EvalDataset]
    present: Callable[[str, Entry, Path, str], bool] = top_folder_present
    task: str = "zeroshot_classification"  # zeroshot_retrieval: a caption set (--annotation_file replaces its file)
    val_reads_test: bool = False  # split "val" accepted where "test" is listed (ImageNet's val folder is its test)

    def describe(self, entry: Entry) -> str:
        return self.label.format_map(entry)


# -- how each kind is found under the root ---------------------------------------------------------------------------

def _imagenet_present(name: str, entry: Entry, root: Path, split: str) -> bool:
    from clipcache.tasks.datasets.clip_benchmark.imagenet_layouts import is_imagenet_folder

    return is_imagenet_folder(root, split)


def _wnid_present(name: str, entry: Entry, root: Path, split: str) -> bool:
    from clipcache.tasks.datasets.clip_benchmark.imagenet_layouts import has_wnid_folders

    return has_wnid_folders(root)


def _flickr_present(name: str, entry: Entry, root: Path, split: str) -> bool:
    from clipcache.tasks.datasets.clip_benchmark.internvl_cn import is_cn_folder
    from clipcache.tasks.datasets.clip_benchmark.original_captions import is_flickr_folder

    return is_flickr_folder(name, root) or is_cn_folder(name, root)


def _coco_present(name: str, entry: Entry, root: Path, split: str) -> bool:
    from clipcache.tasks.datasets.clip_benchmark.internvl_cn import is_cn_folder

    return any(root.glob("coco_*_karpathy.json")) or (root / "val2014").is_dir() or is_cn_folder(name, root)


def _captions_json_present(name: str, entry: Entry, root: Path, split: str) -> bool:
    return any(root.glob(entry["folder"].format(language="*")))


def _class_folders_present(name: str, entry: Entry, root: Path, split: str) -> bool:
    """Class folders, not a webdataset split folder (<split>/nshards.txt)."""
    folder = root / ("train" if split == "train" else "test")
    return folder.is_dir() and not (folder / "nshards.txt").exists() and any(p.is_dir() for p in folder.iterdir())


# -- how each kind is read -------------------------------------------------------------------------------------------

def _torchvision(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.torchvision_sets import load_torchvision

    folder = root / entry["folder"].format(split=split)
    return load_torchvision(name, entry, root, split, limit, lambda own: english_prompts(name, own, str(folder)))


def _cifar(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.original import load_cifar

    return load_cifar(name, root, split, limit)


def _imagenet(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.imagenet_layouts import load_imagenet_folder

    return load_imagenet_folder(name, root, split, limit)


def _wnid_folder(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.imagenet_layouts import load_wnid_folder

    subset = entry["classnames"].partition(":")[2]
    return load_wnid_folder(name, root, split, limit,
                            subset=dataset_facts()["imagenet_subsets"][subset] if subset else None,
                            prompts=english_prompts(name, [], str(root)))


def _babel(name: str, entry: Entry, root: Path, split: str, limit: int | None, *, language: str = "en",
           **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.imagenet_layouts import load_babel_imagenet

    return load_babel_imagenet(name, root, split, limit, language)


def _objectnet(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.original import load_objectnet

    return load_objectnet(name, root, split, limit, entry["source"])


def _voc2007(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.original import load_voc2007

    return load_voc2007(name, root, split, limit, entry["source"])


def _imagenetv2(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.imagenet_layouts import load_imagenetv2

    return load_imagenetv2(name, root, split, limit, english_prompts(name, [], str(root)))


def _caltech101(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.original import load_caltech101

    return load_caltech101(name, root, split, limit, english_prompts(name, [], str(root)), entry["source"])


def _imagefolder(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.original import load_class_folders

    folder = root / ("train" if split == "train" else "test")
    return load_class_folders(name, folder, split, limit, english_prompts(name, [], str(folder)), entry["source"])


def _flickr(name: str, entry: Entry, root: Path, split: str, limit: int | None, *, language: str = "en",
            annotation_file: str | None = None) -> EvalDataset:
    if language == "cn":  # InternVL's fork: Flickr30K-CN
        from clipcache.tasks.datasets.clip_benchmark.internvl_cn import load_flickr30k_cn

        return load_flickr30k_cn(name, root, split, limit, annotation_file=annotation_file)
    from clipcache.tasks.datasets.clip_benchmark.internvl_flickr import is_fork_layout, load_flickr30k_fork

    if is_fork_layout(name, root, split, language, annotation_file):  # InternVL's fork: Images/, cleaned captions
        return load_flickr30k_fork(name, root, split, limit, annotation_file=annotation_file)
    from clipcache.tasks.datasets.clip_benchmark.original_captions import load_flickr

    return load_flickr(name, root, split, limit, language=language, annotation_file=annotation_file)


def _coco(name: str, entry: Entry, root: Path, split: str, limit: int | None, *, language: str = "en",
          annotation_file: str | None = None) -> EvalDataset:
    if language == "cn":  # InternVL's fork: COCO-CN
        from clipcache.tasks.datasets.clip_benchmark.internvl_cn import load_coco_cn

        return load_coco_cn(name, root, split, limit, annotation_file=annotation_file)
    from clipcache.tasks.datasets.clip_benchmark.original_captions import load_coco_karpathy

    return load_coco_karpathy(name, root, split, limit, language=language, annotation_file=annotation_file)


def _captions_json(name: str, entry: Entry, root: Path, split: str, limit: int | None, *, language: str = "en",
                   annotation_file: str | None = None) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.original_captions import load_captions_json

    return load_captions_json(name, root, split, limit, entry, language=language, annotation_file=annotation_file)


def _birdsnap(name: str, entry: Entry, root: Path, split: str, limit: int | None, **_: Any) -> EvalDataset:
    from clipcache.tasks.datasets.clip_benchmark.birdsnap import load_birdsnap

    return load_birdsnap(name, entry, root, split, limit)


def _birdsnap_present(name: str, entry: Entry, root: Path, split: str) -> bool:
    from clipcache.tasks.datasets.clip_benchmark.birdsnap import is_birdsnap_folder

    return is_birdsnap_folder(name, entry, root, split)


RETRIEVAL = "zeroshot_retrieval"
READERS: dict[str, LayoutReader] = {
    "torchvision": LayoutReader("torchvision {class}", _torchvision),
    "cifar": LayoutReader("torchvision pickles", _cifar),
    "imagenet": LayoutReader("ImageNet folders", _imagenet, _imagenet_present, val_reads_test=True),
    "wnid_folder": LayoutReader("WordNet-id folders", _wnid_folder, _wnid_present),
    "imagenetv2": LayoutReader("ImageNetV2 folders", _imagenetv2),
    "babel": LayoutReader("ImageNet folders", _babel, _imagenet_present, val_reads_test=True),
    "objectnet": LayoutReader("ObjectNet folders", _objectnet),
    "voc2007": LayoutReader("VOCdevkit", _voc2007),
    "caltech101": LayoutReader("101_ObjectCategories", _caltech101),
    "imagefolder": LayoutReader("class folders", _imagefolder, _class_folders_present),
    "flickr": LayoutReader("Karpathy captions", _flickr, _flickr_present, task=RETRIEVAL),
    "coco": LayoutReader("COCO Karpathy JSON", _coco, _coco_present, task=RETRIEVAL),
    "captions_json": LayoutReader("caption JSON", _captions_json, _captions_json_present, task=RETRIEVAL),
    "birdsnap": LayoutReader("InternVL's Birdsnap lists", _birdsnap, _birdsnap_present),
}
