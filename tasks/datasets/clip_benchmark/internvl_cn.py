"""Flickr30K-CN and COCO-CN (``--language cn``) as InternVL's clip_benchmark fork reads them.

InternVL's evaluation README runs ``--dataset flickr30k`` / ``--dataset mscoco_captions`` with ``--language cn``; its
fork of clip_benchmark then reads, under ``--dataset_root``:

- ``flickr30k``: ``flickr30k_cn_<split>.txt`` (the Karpathy-file format: a header line, then ``<image>.jpg,<caption>``
  lines) with the images under ``Images/``;
- ``mscoco_captions``: ``coco-cn_<split>.json`` in COCO's caption format, its ``file_name`` s relative to the root
  (``train2014/...`` and ``val2014/...``: COCO-CN's images come from both), read as torchvision's ``CocoCaptions``
  reads it (images by ascending id).

The fork passes every caption through its ``pre_caption`` (see :func:`fork_caption`) before tokenizing; these readers
do the same, so the texts encoded are the fork's. ``--annotation_file`` replaces the caption file. Nothing is
downloaded: a missing file is named.
"""

from __future__ import annotations

import re
from pathlib import Path

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.clip_benchmark.original_captions import (
    CaptionedImages,
    read_coco_captions,
    read_flickr_captions,
)

FLICKR_FILE = "flickr30k_cn_{split}.txt"
COCO_FILE = "coco-cn_{split}.json"
SOURCE = "InternVL's clip_benchmark fork (github.com/OpenGVLab/InternVL, clip_benchmark/)"
MAX_WORDS = 50
_PUNCTUATION = re.compile(r"[.!\"()*#:;~]")
_SPACES = re.compile(r"\s{2,}")


def fork_caption(caption: str, max_words: int = MAX_WORDS) -> str:
    """The fork's caption clean-up (its datasets/tools.py ``pre_caption``): lower-cased, the ASCII marks
    ``.!"()*#:;~`` made spaces, runs of whitespace made one space, the ends trimmed of newlines and spaces, and cut to
    the first ``max_words`` space-separated words. Chinese text has no spaces between words, so the cut reaches it
    only through Latin words or spaces in it; the full-width marks (``。，（）``) are kept."""
    caption = _SPACES.sub(" ", _PUNCTUATION.sub(" ", caption.lower())).rstrip("\n").strip(" ")
    words = caption.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else caption


def _annotation(name: str, root: Path, file: str, annotation_file: str | None) -> Path:
    annotation = Path(annotation_file) if annotation_file else root / file
    if not annotation.is_file():
        raise DatasetError(f"dataset {name!r} (--language cn): {annotation} not found (the Chinese captions "
                           f"{SOURCE} reads; see InternVL's clip_benchmark README)")
    return annotation


def _checked(name: str, annotation: Path, paths: list[Path]) -> None:
    if not paths:
        raise DatasetError(f"dataset {name!r}: {annotation} lists no images")
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:
        raise DatasetError(f"dataset {name!r}: image {missing} (named in {annotation.name}) not found")


def is_cn_folder(name: str, root: Path) -> bool:
    pattern = {"flickr30k": FLICKR_FILE, "mscoco_captions": COCO_FILE}.get(name)
    return pattern is not None and any(Path(root).glob(pattern.format(split="*")))


def load_flickr30k_cn(name: str, root: Path, split: str, limit: int | None, *,
                      annotation_file: str | None = None) -> CaptionedImages:
    """The fork's ``Flickr(root/Images, flickr30k_cn_<split>.txt, target_transform=pre_caption)``: images in the
    order they first appear, each with its captions in file order."""
    root = Path(root)
    annotation = _annotation(name, root, FLICKR_FILE.format(split=split), annotation_file)
    items = list(read_flickr_captions(annotation).items())[:limit]
    images = root / "Images"
    paths = [images / image for image, _ in items]
    _checked(name, annotation, paths)
    return CaptionedImages(name=name, split=split, task="zeroshot_retrieval",
                           captions=[[fork_caption(c) for c in captions] for _, captions in items], paths=paths,
                           root=images, layout="flickr-cn", annotation=annotation, languages=("cn",))


def load_coco_cn(name: str, root: Path, split: str, limit: int | None, *,
                 annotation_file: str | None = None) -> CaptionedImages:
    """The fork's ``CocoCaptions(root, coco-cn_<split>.json, target_transform=pre_caption)``: images by ascending id
    under the root itself, each with its captions in file order."""
    root = Path(root)
    annotation = _annotation(name, root, COCO_FILE.format(split=split), annotation_file)
    files, captions = read_coco_captions(annotation)
    ids = sorted(files)[:limit]
    paths = [root / files[i] for i in ids]
    _checked(name, annotation, paths)
    return CaptionedImages(name=name, split=split, task="zeroshot_retrieval",
                           captions=[[fork_caption(c) for c in captions[i]] for i in ids], paths=paths, root=root,
                           layout="coco-cn", annotation=annotation, languages=("cn",))
