"""More image-caption selection sets, read from their original files: ARO's four and VALSE's pieces. Each is a
:class:`~clipcache.tasks.datasets.selection.SelectionDataset` scored by ``image_caption_selection``, with the
caption order and tie rule of its own evaluation code (``targets``: which caption is the right one).

- ``aro/vg_relation``, ``aro/vg_attribution`` (mertyg/vision-language-models-are-bows, ``VG_Relation`` /
  ``VG_Attribution``): ``--dataset_root`` holds ``visual_genome_relation.json`` / ``visual_genome_attribution.json``
  (a list of ``{"image_path", "bbox_x", "bbox_y", "bbox_w", "bbox_h", "true_caption", "false_caption",
  "relation_name" | "attributes"}``) and ``images/`` (the unzipped ``vgr_vga_images.zip``). Each item is the box
  ``(x, y, x + w, y + h)`` cropped out of its RGB image, with captions ``[false_caption, true_caption]``: ARO's
  ``argmax == 1``, so a tie (the first index wins) is a miss. ``acc`` is ARO's micro ``Accuracy``, ``macro_acc``
  the number its paper reports: the mean per-relation accuracy without the relations its notebook lists as
  symmetric (VG-Relation), the mean per attribute pair over pairs with at least 25 items (VG-Attribution).
- ``aro/coco_order``, ``aro/flickr30k_order`` (``COCO_Order`` / ``Flickr30k_Order``): ``--dataset_root`` is ARO's
  ``root_dir``: the images at the paths its Karpathy files name (``val2014/COCO_val2014_....jpg``,
  ``flickr30k-images/....jpg``) and the test cases ARO builds from those files, written once as
  ``coco_order_<split>.json`` / ``flickr30k_order_<split>.json`` (``json.dump(dataset.test_cases, f)`` on ARO's
  dataset object: a list of ``{"image", "caption_options"}``, the caption first, then its four perturbations;
  its perturbations need spaCy's and NLTK's models and its seed, so the file is the data of record). ``acc`` is
  ARO's ``Precision@1`` (``argmax == 0``).
- ``valse/<piece>`` (Heidelberg-NLP/VALSE): ``--dataset_root`` holds ``<piece>.json`` (the repository's
  ``data/<piece>.json``; ``data/`` itself is looked in too) and ``images/`` with the piece's images by
  ``image_file``. Only VALSE's valid items (``mturk.caption >= 2``), in the file's order; captions ``[foil,
  caption]``, so ``acc`` is VALSE's pairwise accuracy ``acc_r``: the caption scores strictly above the foil.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, cast

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.selection import Crop, SelectionDataset

ARO_REPO = "https://github.com/mertyg/vision-language-models-are-bows"
VALSE_REPO = "https://github.com/Heidelberg-NLP/VALSE"
ARO_VG = {"aro/vg_relation": "visual_genome_relation.json", "aro/vg_attribution": "visual_genome_attribution.json"}
ARO_ORDER = {"aro/coco_order": "coco_order", "aro/flickr30k_order": "flickr30k_order"}


@cache
def facts() -> dict[str, Any]:
    """The lists the reference code holds (compositionality.json beside this module, with its provenance)."""
    data: dict[str, Any] = json.loads(Path(__file__).with_name("compositionality.json").read_text(encoding="utf-8"))
    return data


def valse_names() -> tuple[str, ...]:
    return tuple(f"valse/{piece}" for piece in facts()["valse_pieces"])


def read_json(name: str, path: Path, what: str) -> Any:
    """Dataset ``name``'s JSON index file; a missing or broken one is one line naming it (``what``: where to get it)."""
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"dataset {name!r}: {path} is not a JSON file ({e})") from e
    except FileNotFoundError as e:
        raise DatasetError(f"dataset {name!r}: {path} not found ({what})") from e


def only_splits(name: str, split: str, splits: tuple[str, ...] = ("test",)) -> None:
    """Dataset ``name`` has only ``splits``: asking for another is one line."""
    if split not in splits:
        raise DatasetError(f"dataset {name!r} has the splits {', '.join(splits)} (asked for {split!r})")


class _Items:
    """Collects items: each distinct image source once, the items' image indices, captions and keys."""

    def __init__(self, ds: SelectionDataset) -> None:
        self.ds = ds
        self.rows: dict[Path | Crop, int] = {}
        self.item_images: list[list[int]] = []
        self.captions: list[list[str]] = []

    def add(self, key: str, source: Path | Crop, captions: list[str]) -> None:
        path = source.path if isinstance(source, Crop) else source
        if source not in self.rows:
            if not path.is_file():
                raise DatasetError(f"dataset {self.ds.name!r} item {key}: image {path} not found")
            self.rows[source] = len(self.rows)
        self.item_images.append([self.rows[source]])
        self.captions.append(captions)
        self.ds.item_keys.append(key)

    def done(self) -> SelectionDataset:
        if not self.item_images:
            raise DatasetError(f"dataset {self.ds.name!r}: no items in {self.ds.index_files[0]}")
        self.ds.sources = list(self.rows)
        self.ds.captions = self.captions
        self.ds.item_images = np.asarray(self.item_images, dtype=np.int64)
        return self.ds


def _strings(item: Any, keys: tuple[str, ...]) -> bool:
    return isinstance(item, dict) and all(isinstance(item.get(k), str) for k in keys)


def load_aro_vg(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    """ARO's VG-Relation / VG-Attribution: box crops, captions ``[false, true]``, items grouped for ``macro_acc``."""
    if name not in ARO_VG:
        raise DatasetError(f"dataset {name!r}: ARO's Visual Genome sets are {', '.join(ARO_VG)}")
    only_splits(name, split)
    ann, images = root / ARO_VG[name], root / "images"
    items = read_json(name, ann, f"ARO's annotation file; its VG_Relation / VG_Attribution download it, {ARO_REPO}")
    if not images.is_dir():
        raise DatasetError(f"dataset {name!r}: {images}/ not found (ARO's vgr_vga_images.zip unzipped there; "
                           f"{ARO_REPO})")
    if not isinstance(items, list):
        raise DatasetError(f"dataset {name!r}: {ann} must hold a list of test cases")
    relation = name == "aro/vg_relation"
    ds = SelectionDataset(name=name, split=split, task="image_caption_selection", index_files=[ann],
                          image_folder=images, targets=(1,))
    if relation:
        ds.macro_exclude = frozenset(facts()["aro_vg_relation_excluded"])
    else:
        ds.macro_min_count = int(facts()["aro_vg_attribution_min_count"])
    groups: list[str] = []
    collected = _Items(ds)
    for index, item in enumerate(items[:limit]):
        box = [item.get(f"bbox_{k}") for k in "xywh"] if isinstance(item, dict) else []
        attrs = item.get("attributes") if isinstance(item, dict) else None
        group_ok = (isinstance(item.get("relation_name"), str) if relation else
                    isinstance(attrs, list) and len(attrs) >= 2)
        if not (_strings(item, ("image_path", "true_caption", "false_caption")) and group_ok
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)):
            raise DatasetError(f"{ann} item {index}: expected 'image_path', 'true_caption', 'false_caption', numeric "
                               f"'bbox_x/y/w/h' and {'relation_name' if relation else 'two attributes'}")
        x, y, w, h = cast(list[float], box)  # checked numbers; PIL rounds them as ARO's crop does
        crop = Crop(images / item["image_path"], (x, y, x + w, y + h))
        collected.add(str(index), crop, [item["false_caption"], item["true_caption"]])
        groups.append(item["relation_name"] if relation else f"{attrs[0]}_{attrs[1]}")  # type: ignore[index]
    ds.groups = groups
    return collected.done()


def load_aro_order(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    """ARO's COCO-Order / Flickr30k-Order from the test cases its dataset objects build: the caption first."""
    if name not in ARO_ORDER:
        raise DatasetError(f"dataset {name!r}: ARO's order sets are {', '.join(ARO_ORDER)}")
    only_splits(name, split, ("test", "val"))
    cases_file = root / f"{ARO_ORDER[name]}_{split}.json"
    cases = read_json(name, cases_file, f"the test cases of ARO's {'COCO_Order' if 'coco' in name else 'Flickr30k_Order'}"
                                         f"(split={split!r}), written with json.dump(dataset.test_cases, f); {ARO_REPO}")
    if not isinstance(cases, list):
        raise DatasetError(f"dataset {name!r}: {cases_file} must hold a list of test cases")
    ds = SelectionDataset(name=name, split=split, task="image_caption_selection", index_files=[cases_file],
                          image_folder=root, targets=(0,))
    collected = _Items(ds)
    width = None
    for index, case in enumerate(cases[:limit]):
        options = case.get("caption_options") if isinstance(case, dict) else None
        if not (_strings(case, ("image",)) and isinstance(options, list) and len(options) >= 2
                and all(isinstance(c, str) for c in options)):
            raise DatasetError(f"{cases_file} test case {index}: expected 'image' and a list 'caption_options' of "
                               f"at least two strings")
        if width is not None and len(options) != width:
            raise DatasetError(f"{cases_file} test case {index}: {len(options)} caption options, the first case has "
                               f"{width}")
        width = len(options)
        collected.add(str(index), root / case["image"], list(options))
    return collected.done()


def load_valse(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    """A VALSE piece: its valid items (``mturk.caption >= 2``), captions ``[foil, caption]``."""
    piece = name.split("/", 1)[1] if "/" in name else ""
    if piece not in facts()["valse_pieces"]:
        raise DatasetError(f"dataset {name!r}: VALSE's pieces are {', '.join(facts()['valse_pieces'])}")
    only_splits(name, split)
    ann = next((p for p in (root / f"{piece}.json", root / "data" / f"{piece}.json") if p.is_file()),
               root / f"{piece}.json")
    items = read_json(name, ann, f"VALSE's data/{piece}.json, {VALSE_REPO}")
    images = root / "images"
    if not images.is_dir():
        raise DatasetError(f"dataset {name!r}: {images}/ not found (the piece's images by image_file, from the "
                           f"datasets VALSE names in each item's 'dataset')")
    if not isinstance(items, dict):
        raise DatasetError(f"dataset {name!r}: {ann} must hold an object of items keyed by id")
    ds = SelectionDataset(name=name, split=split, task="image_caption_selection", index_files=[ann],
                          image_folder=images, targets=(1,))
    collected = _Items(ds)
    for key, item in items.items():
        if limit is not None and len(collected.item_images) >= limit:
            break
        votes = item.get("mturk", {}).get("caption") if isinstance(item, dict) else None
        if not (_strings(item, ("image_file", "caption", "foil")) and isinstance(votes, int)):
            raise DatasetError(f"{ann} item {key!r}: expected strings 'image_file', 'caption', 'foil' and an "
                               f"integer 'mturk.caption'")
        if votes >= 2:  # VALSE's valid set: at least two of three annotators chose the caption, not the foil
            collected.add(str(key), images / item["image_file"], [item["foil"], item["caption"]])
    return collected.done()


MMVP_REPO = "https://github.com/tsb0601/MMVP"


def load_mmvp_vlm(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    """MMVP-VLM (tsb0601/MMVP ``scripts/evaluate_vlm.py``): ``Questions.csv`` rows in pairs, each pair's images
    ``MLLM_VLM Images/<first row's type>/<qid>.jpg``, texts ``"a photo of " + statement``. Its rule: statement 1
    picks image 1 when ``P(image 1) > 0.5`` (image 1 strictly closer), else image 2, and a pair counts when each
    statement picks its own image. Listed in reverse (``[image 2, image 1]``, ``[statement 2, statement 1]``), the
    first-index tie rule of ``image_acc`` gives a tie to image 2 as MMVP does, so ``image_acc`` is its pair accuracy
    (its nine categories have 15 pairs each, so the mean of its per-category numbers is this too)."""
    import csv

    only_splits(name, split)
    questions, images = root / "Questions.csv", root / "MLLM_VLM Images"
    if not questions.is_file() or not images.is_dir():
        raise DatasetError(f"dataset {name!r}: {questions} and {images}/ needed (the MMVP_VLM dataset folder; "
                           f"{MMVP_REPO})")
    with open(questions, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f))[1:]
    ds = SelectionDataset(name=name, split=split, task="image_caption_selection", index_files=[questions],
                          image_folder=images)
    sources: list[Path] = []
    item_images: list[list[int]] = []
    captions: list[list[str]] = []
    for first, second in zip(rows[0::2], rows[1::2], strict=False):  # an unpaired last row is dropped, as MMVP does
        if limit is not None and len(item_images) >= limit:
            break
        if len(first) != 3 or len(second) != 3 or not (first[0].isdigit() and second[0].isdigit()):
            raise DatasetError(f"{questions}: expected rows 'qid,type,statement' with integer ids, got {first} / "
                               f"{second}")
        pair = [images / first[1] / f"{int(row[0])}.jpg" for row in (second, first)]
        for path in pair:
            if not path.is_file():
                raise DatasetError(f"dataset {name!r} question {first[0]}: image {path} not found")
        item_images.append([len(sources), len(sources) + 1])
        sources += pair
        captions.append(["a photo of " + second[2], "a photo of " + first[2]])
        ds.item_keys.append(f"{first[0]}-{second[0]}")
    if not item_images:
        raise DatasetError(f"dataset {name!r}: {questions} has no question pairs")
    ds.sources, ds.captions = list(sources), captions
    ds.item_images = np.asarray(item_images, dtype=np.int64)
    return ds
