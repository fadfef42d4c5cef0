"""English Flickr30K in the layout InternVL's clip_benchmark fork reads (``--dataset flickr30k --language en``).

LAION clip_benchmark reads ``flickr30k_<split>_karpathy.txt`` with the images beside it, under the root, and keeps the
captions as written. InternVL's fork reads the same caption file (or ``--annotation_file``) but takes the images from
``<root>/Images/`` (the Kaggle download unpacked as is) and passes every caption through its ``pre_caption``
(lower case, ``.!"()*#:;~`` made spaces, at most 50 words: :func:`internvl_cn.fork_caption`). The seed's English
Flickr30K numbers for InternVL-C/G were made that way.

Which reader applies is decided by where the caption file's first image is: beside the file (LAION's layout, read
exactly as before) or only under ``Images/`` (the fork's). A folder holding it in both places is refused in one line
rather than guessed. The fork's reading is its own dataset identity (layout ``flickr-en-internvl``: its own caption
entries in the cache) and its own experiment (the task option ``reader: internvl_fork``, as ``--annotation_file``
makes one), so numbers of the two layouts never share an entry, an experiment or a leaderboard row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.clip_benchmark.internvl_cn import SOURCE, fork_caption
from clipcache.tasks.datasets.clip_benchmark.original_captions import (
    FLICKR_FILES,
    CaptionedImages,
    read_flickr_captions,
)

LAYOUT = "flickr-en-internvl"
IMAGES = "Images"
READER = "internvl_fork"


@dataclass
class ForkFlickr(CaptionedImages):
    experiment_reader: str = READER  # recorded in the experiment's options (flows/pipeline.py: reader_option)


def _annotation(name: str, root: Path, split: str, annotation_file: str | None) -> Path:
    return Path(annotation_file) if annotation_file else root / FLICKR_FILES["en"].format(name=name, split=split)


def is_fork_layout(name: str, root: Path, split: str, language: str, annotation_file: str | None) -> bool:
    """Whether ``root`` holds English Flickr30K as InternVL's fork lays it out: the caption file's first image under
    ``Images/`` and not beside the file. Any other folder is LAION's layout (its errors stay LAION's)."""
    root = Path(root)
    if name != "flickr30k" or language != "en" or not (root / IMAGES).is_dir():
        return False
    annotation = _annotation(name, root, split, annotation_file)
    if not annotation.is_file():
        return False
    first = next(iter(read_flickr_captions(annotation)), None)
    if first is None:
        return False
    in_root, in_images = (root / first).is_file(), (root / IMAGES / first).is_file()
    if in_root and in_images:
        raise DatasetError(f"dataset {name!r}: {first} is both in {root} (LAION clip_benchmark's layout) and in "
                           f"{root / IMAGES} (InternVL's clip_benchmark fork's layout, whose captions are cleaned "
                           f"differently); keep one copy so the reader is not a guess")
    return in_images


def load_flickr30k_fork(name: str, root: Path, split: str, limit: int | None, *,
                        annotation_file: str | None = None) -> CaptionedImages:
    """The fork's ``Flickr(root/Images, flickr30k_<split>_karpathy.txt, target_transform=pre_caption)``: images in
    the order they first appear, each with its captions in file order, cleaned."""
    root = Path(root)
    annotation = _annotation(name, root, split, annotation_file)
    items = list(read_flickr_captions(annotation).items())[:limit]
    images = root / IMAGES
    paths = [images / image for image, _ in items]
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:
        raise DatasetError(f"dataset {name!r}: image {missing} (named in {annotation.name}) not found ({SOURCE} "
                           f"reads the images from {images})")
    return ForkFlickr(name=name, split=split, task="zeroshot_retrieval",
                      captions=[[fork_caption(c) for c in captions] for _, captions in items], paths=paths,
                      root=images, layout=LAYOUT, annotation=annotation, languages=("en",))
