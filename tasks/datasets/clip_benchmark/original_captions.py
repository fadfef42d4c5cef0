"""clip_benchmark's original caption layouts (zero-shot retrieval), read as clip_benchmark reads them.

- ``flickr30k`` / ``flickr8k``: images under the root + ``<name>_<split>_karpathy.txt`` (``_zh.txt`` for
  ``--language zh``), clip_benchmark's ``Flickr`` reader.
- ``mscoco_captions``: ``val2014/`` (``train2014/`` for the train split) + ``coco_<split>_karpathy.json`` or
  ``--annotation_file``, read as torchvision's ``CocoCaptions`` reads it (images by ascending id, each with its
  captions in file order) without needing pycocotools.
- ``multilingual_mscoco_captions``, ``crossmodal3600``, ``xtd10``, ``xtd200``, ``flickr30k-200``: the annotation file
  clip_benchmark writes per language (``{"image_paths": [...], "annotations": [...]}``, one caption per image).

Nothing is downloaded: a missing file is named, with where clip_benchmark gets it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.clip_benchmark.original import FolderImages

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

    def image_identity(self, memo: FileHashMemo) -> dict[str, Any]:
        """The image files in order, whatever caption file (language) lists them: Flickr's en and zh files, or the
        eleven xtd10 languages, share one image entry."""
        return {"format": "image-files", "images": memo.fingerprint(self.paths, root=self.root)}


def read_flickr_captions(annotation: Path) -> dict[str, list[str]]:
    """clip_benchmark's Flickr caption file: a header line, then ``<image>.jpg,<caption>`` lines (split at the first
    ``.jpg,``); the images in the order they first appear, each with its captions in file order."""
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
    return captions


def load_flickr(name: str, root: Path, split: str, limit: int | None, *, language: str = "en",
                annotation_file: str | None = None) -> CaptionedImages:
    """clip_benchmark's Flickr reader: a header line, then ``<image>.jpg,<caption>`` lines (split at the first
    ``.jpg,``); images in the order they first appear, each with its captions in file order; images under root."""
    root = Path(root)
    if language not in FLICKR_FILES:
        raise DatasetError(f"language: {language!r} is not available for dataset {name!r} (available: "
                           f"{', '.join(FLICKR_FILES)})")
    file = FLICKR_FILES[language].format(name=name, split=split)
    annotation = Path(annotation_file) if annotation_file else root / file
    if not annotation.is_file():
        raise DatasetError(f"dataset {name!r}: {annotation} not found (clip_benchmark downloads it from "
                           f"{FLICKR_ANNOTATIONS.format(file=file)})")
    items = list(read_flickr_captions(annotation).items())[:limit]
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


# -- MS-COCO captions: Karpathy-split JSON in COCO's format --------------------------------------------------------------
def _read_json(path: Path, name: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start + 1})") from e
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from e


def read_coco_captions(annotation: Path) -> tuple[dict[Any, str], dict[Any, list[str]]]:
    """A caption file in COCO's format as pycocotools indexes it: each image id's ``file_name``, and its captions in
    the order the file lists them (an image without captions has none)."""
    data = _read_json(annotation, annotation.name)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
            or not isinstance(data.get("annotations"), list):
        raise DatasetError(f"{annotation}: expected COCO's format, an object with 'images' and 'annotations' lists")
    files: dict[Any, str] = {}
    for n, image in enumerate(data["images"]):
        if not isinstance(image, dict) or "id" not in image or not isinstance(image.get("file_name"), str):
            raise DatasetError(f"{annotation}: images[{n}] needs an 'id' and a 'file_name'")
        files[image["id"]] = image["file_name"]
    captions: dict[Any, list[str]] = {i: [] for i in files}
    for n, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or not isinstance(ann.get("caption"), str) or ann.get("image_id") not in files:
            raise DatasetError(f"{annotation}: annotations[{n}] needs a 'caption' and the 'image_id' of a listed "
                               f"image")
        captions[ann["image_id"]].append(ann["caption"])
    return files, captions


def load_coco_karpathy(name: str, root: Path, split: str, limit: int | None, *, language: str = "en",
                       annotation_file: str | None = None) -> CaptionedImages:
    """torchvision's ``CocoCaptions(root/<train2014|val2014>, annFile)``: images by ascending id, captions in the
    order the file lists them, an image without captions kept with none."""
    root = Path(root)
    if language != "en":
        raise DatasetError(f"language: {language!r} is not available for dataset {name!r} (available: en; "
                           f"multilingual_mscoco_captions has other languages)")
    if split not in ("train", "val", "test"):
        raise DatasetError(f"dataset {name!r} has the splits train, val and test (asked for {split!r})")
    images_dir = root / ("train2014" if split == "train" else "val2014")
    annotation = Path(annotation_file) if annotation_file else root / f"coco_{split}_karpathy.json"
    if not annotation.is_file():
        raise DatasetError(f"dataset {name!r}: {annotation} not found (clip_benchmark downloads it from "
                           f"{FLICKR_ANNOTATIONS.format(file=annotation.name)})")
    files, captions = read_coco_captions(annotation)
    ids = sorted(files)[:limit]
    if not ids:
        raise DatasetError(f"dataset {name!r}: {annotation} lists no images")
    if not images_dir.is_dir():
        raise DatasetError(f"dataset {name!r}: {images_dir} not found (clip_benchmark downloads "
                           f"http://images.cocodataset.org/zips/{images_dir.name}.zip and unpacks it there)")
    paths = [images_dir / files[i] for i in ids]
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:
        raise DatasetError(f"dataset {name!r}: image {missing} (named in {annotation.name}) not found")
    return CaptionedImages(name=name, split=split, task="zeroshot_retrieval", captions=[captions[i] for i in ids],
                           paths=paths, root=images_dir, layout="coco-karpathy", annotation=annotation)


# -- The multilingual sets: clip_benchmark's per-language annotation JSON ------------------------------------------------
def _image_path(raw: str, root: Path) -> Path:
    """clip_benchmark writes ``os.path.join(root, <set>, "images", <file>)`` as the root was given then; read it as
    written, else under the root as it is now (the folder may have moved)."""
    path = Path(raw)
    for candidate in (path, root / path, root.joinpath(*path.parts[-3:])):
        if candidate.is_file():
            return candidate
    return path


def load_captions_json(name: str, root: Path, split: str, limit: int | None, entry: dict[str, Any], *,
                       language: str = "en", annotation_file: str | None = None) -> CaptionedImages:
    root = Path(root)
    languages = entry["languages"]
    if language not in languages:
        raise DatasetError(f"language: {language!r} is not available for dataset {name!r} (available: "
                           f"{', '.join(languages[:12])}{', ...' if len(languages) > 12 else ''})")
    annotation = Path(annotation_file) if annotation_file else root / entry["folder"].format(language=language)
    if not annotation.is_file() and name == "crossmodal3600" and (root / "xm3600" / "captions.jsonl").is_file():
        return _crossmodal3600_from_captions(name, root, split, limit, entry, language)
    if not annotation.is_file():
        raise DatasetError(f"dataset {name!r}: {annotation} not found (clip_benchmark writes it with "
                           f"{entry['maker']}(root, {language!r}), downloading the "
                           f"images and captions)")
    data = _read_json(annotation, name)
    if not isinstance(data, dict) or not isinstance(data.get("image_paths"), list) \
            or not isinstance(data.get("annotations"), list) or len(data["image_paths"]) != len(data["annotations"]):
        raise DatasetError(f"{annotation}: expected an object with 'image_paths' and 'annotations' lists of one "
                           f"length")
    bad = next((i for i, (p, c) in enumerate(zip(data["image_paths"], data["annotations"], strict=True))
                if not isinstance(p, str) or not isinstance(c, str)), None)
    if bad is not None:
        raise DatasetError(f"{annotation}: item {bad} needs an image path and one caption, both strings")
    items = list(zip(data["image_paths"], data["annotations"], strict=True))[:limit]
    if not items:
        raise DatasetError(f"dataset {name!r}: {annotation} lists no images")
    paths = [_image_path(p, root) for p, _ in items]
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:
        raise DatasetError(f"dataset {name!r}: image {missing} (named in {annotation.name}) not found")
    present = tuple(lang for lang in languages if (root / entry["folder"].format(language=lang)).is_file())
    return CaptionedImages(name=name, split=split, task="zeroshot_retrieval", captions=[[c] for _, c in items],
                           paths=paths, root=root, layout=f"{name}-{language}", annotation=annotation,
                           languages=present or (language,))


def _crossmodal3600_from_captions(name: str, root: Path, split: str, limit: int | None, entry: dict[str, Any],
                                  language: str) -> CaptionedImages:
    """What clip_benchmark's crossmodal3600.create_annotation_file derives offline from the downloaded
    ``xm3600/captions.jsonl`` (read here, nothing written): each image present under ``xm3600/images/`` with its
    first caption in ``language``."""
    from clipcache.tasks.datasets.base import iter_jsonl_records

    source = root / "xm3600" / "captions.jsonl"
    paths, captions = [], []
    for line_no, record in iter_jsonl_records(source, ("image/key",)):
        path = root / "xm3600" / "images" / f"{record['image/key']}.jpg"
        if not path.is_file():
            continue  # clip_benchmark leaves out images it cannot find, and says how many
        try:
            captions.append(str(record[language]["caption"][0]))
        except (KeyError, IndexError, TypeError) as e:
            raise DatasetError(f"{source} line {line_no}: no {language!r} caption") from e
        paths.append(path)
    if not paths:
        raise DatasetError(f"dataset {name!r}: none of the images {source} lists is under {source.parent / 'images'}")
    return CaptionedImages(name=name, split=split, task="zeroshot_retrieval", captions=[[c] for c in captions[:limit]],
                           paths=paths[:limit], root=root, layout=f"{name}-{language}", annotation=source,
                           languages=tuple(entry["languages"]))
