"""COLA, CREPE and VL-CheckList on image-caption selection, read from their original files, each scored with its own
evaluation code's rule (``compositionality.py`` beside this module holds ARO, VALSE and MMVP-VLM; the lists the
reference code holds are in ``compositionality_more.json``, with their provenance).

- ``cola/multi_objects`` (arijitray1993/COLA, ``data/COLA_multiobjects_matching_benchmark.json``): ``--dataset_root``
  holds that file (or ``data/`` with it) and the images its links name, at the links' last two path parts
  (``vg_gqa_images/<Visual Genome id>.jpg``). Each entry ``[image 1 link, caption 1, image 2 link, caption 2]`` is one
  item, images ``[1, 2]``, captions ``[1, 2]``. COLA's number is ``ColaMultiObjAcc`` in its ``scripts/eval.py``:
  ``im0_c0 > im1_c0 and im1_c1 > im0_c1``, each caption strictly closer to its own image (text-to-image, the
  number its paper reports for the multi-object setting): ``image_acc``, scored ``strict`` (a tie is a miss).
  ``text_acc`` / ``acc`` are Winoground's text and group scores under the same strict rule.
- ``crepe/productivity/<atom|negate|swap>`` and ``crepe/systematicity/<atom|comp|combined>/<cc12m|yfcc|laion>``
  (RAIVNLab/CREPE, ``crepe_compo_eval_open_clip.py``): ``--dataset_root`` holds the unzipped hard-negative sets, as
  its ``--input-dir`` names them: ``prod_hard_negatives/<type>/prod_vg_hard_negs_<type>_complexity_<4..12>.csv``
  and ``syst_hard_negatives/syst_vg_hard_negs_<seen|unseen>_compounds_in_<train set>.csv`` (the folders may also be
  the root itself), and the Visual Genome images in ``VG_100K/`` then ``VG_100K_2/`` (``<image_id>.jpg``, searched
  in that order as ``crepe_eval_utils.get_image_by_id``). Each CSV row (``image_id, x, y, width, height, caption``
  and the list literal ``hard_negs`` / ``valid_hard_negs_<type>``, read as data by tasks/datasets/text_cells.py
  where CREPE's code uses ``ast.literal_eval``) is
  one item: the box ``(x, y, x + width, y + height)`` cropped out of the RGB image (its ``TF.crop(image, y, x,
  height, width)``), captions ``[caption, *hard negatives]``. CREPE's recall@1 is ``get_one2many_rank(...) < 1``:
  the caption first in ``torch.argsort(descending=True)``, whose CPU sort keeps tied values in index order, so a tie
  goes to the caption, as ``text_acc``'s first-index rule gives it. Rows with fewer hard negatives are padded with
  their last text (a repeated rival changes no rank-1 outcome). Its per-file numbers are the sub-scores
  ``text_acc:complexity_<n>`` (productivity) and ``text_acc:<seen|unseen>_compounds`` (systematicity).
- ``vl_checklist/<object|attribute|relation>`` (om-ai-lab/VL-CheckList): ``--dataset_root`` is the folder its
  ``Evaluate`` runs in: ``corpus/v1/<Type>/<...>/<name>.yaml`` (``ANNO_PATH``, ``IMG_ROOT``), the ``data/`` JSON
  files they name (``[[image path, {"POS": [...], "NEG": [...]}], ...]``) and the image folders (``vg/``, ``swig/``,
  ``hake/``, as its DATASETS.md lays them out). Each entry is one item: the whole image, captions ``[NEG[0],
  POS[0]]``: its ITC rule (``vl_checklist/evaluate.py``, ``Evaluate.eval``) counts an item right when the positive
  scores strictly above the negative, so a tie is a miss (scored ``strict``, each pair on its own). Sub-scores: ``text_acc:<Type>_<...>_<name>`` per corpus
  file (its ``total_acc``); per subtype (``text_acc:large``, ..., ``text_acc:spatial``) the mean over sources of the
  mean over each source's files of the files' ``round(acc, 4)``, as ``radar.py``'s ``generate_chart`` averages the
  ``total_acc`` it reads back; and ``text_acc:<type>`` the mean of the type's subtypes (the paper's column). Its
  loader skips entries whose image is missing; here a missing image is an error, so a complete image folder gives
  its item set. Its ``MAX_NUM`` config (each file cut to its first ``MAX_NUM / 2`` entries for ITC) is not applied:
  every entry is read.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.datasets.compositionality.compositionality import only_splits, read_json
from clipcache.tasks.datasets.reader import DatasetReader
from clipcache.tasks.datasets.selection import Crop, SelectionDataset
from clipcache.tasks.datasets.text_cells import quoted_list

COLA_REPO = "https://github.com/arijitray1993/COLA"
CREPE_REPO = "https://github.com/RAIVNLab/CREPE"
VL_CHECKLIST_REPO = "https://github.com/om-ai-lab/VL-CheckList"
COLA_FILE = "COLA_multiobjects_matching_benchmark.json"


@cache
def facts() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(__file__).with_name("compositionality_more.json")
                                      .read_text(encoding="utf-8"))
    return data


def crepe_names() -> tuple[str, ...]:
    f = facts()
    return (*(f"crepe/productivity/{t}" for t in f["crepe_productivity_types"]),
            *(f"crepe/systematicity/{t}/{d}" for t in f["crepe_systematicity_types"]
              for d in f["crepe_train_datasets"]))


def vl_checklist_names() -> tuple[str, ...]:
    return tuple(f"vl_checklist/{t}" for t in facts()["vl_checklist_types"])


@dataclass
class GroupedSelection(SelectionDataset):
    """A selection set whose reference reports ``text_acc`` per group of items (``item_groups``: a CREPE file, a
    VL-CheckList corpus file), in first-seen order; not ``groups``, which ARO's ``macro_acc`` reads."""

    item_groups: list[str] = field(default_factory=list)

    def group_accuracies(self, samples: dict[str, np.ndarray]) -> dict[str, float]:
        labels = np.asarray(self.item_groups)[samples["sample_index"]]
        right = np.asarray(samples["text_right"], dtype=bool)
        return {g: float(right[labels == g].mean()) for g in dict.fromkeys(labels.tolist())}

    def group_metrics(self, samples: dict[str, np.ndarray]) -> dict[str, float]:
        return {f"text_acc:{g}": acc for g, acc in self.group_accuracies(samples).items()}


@dataclass
class VlChecklistSelection(GroupedSelection):
    """VL-CheckList: per corpus file, per subtype (radar.py's average of rounded file accuracies), per type."""

    def group_metrics(self, samples: dict[str, np.ndarray]) -> dict[str, float]:
        files = self.group_accuracies(samples)
        out = {f"text_acc:{g}": acc for g, acc in files.items()}
        kind = self.name.split("/", 1)[1]
        subtypes: list[float] = []
        for key in facts()["vl_checklist_types"][kind]:
            sources = facts()["vl_checklist_corpus"][key]
            names = [[p.replace("/", "_") for p in paths] for paths in sources.values()]
            if not all(n in files for paths in names for n in paths):
                continue  # radar.py stops where a file was not evaluated (a --limit that ends before it)
            per_source = [sum(round(files[n], 4) for n in paths) / len(paths) for paths in names]
            out[f"text_acc:{key}"] = sum(per_source) / len(per_source)
            subtypes.append(out[f"text_acc:{key}"])
        if len(subtypes) == len(facts()["vl_checklist_types"][kind]):
            out[f"text_acc:{kind}"] = float(np.mean(subtypes))
        return out


class ItemCollector:
    """Distinct image sources once; per item its image indices, captions, key and group."""

    def __init__(self, ds: SelectionDataset) -> None:
        self.ds = ds
        self.rows: dict[Path | Crop, int] = {}
        self.item_images: list[list[int]] = []
        self.captions: list[list[str]] = []
        self.groups: list[str] = []

    def full(self, limit: int | None) -> bool:
        return limit is not None and len(self.item_images) >= limit

    def add(self, where: str, sources: list[Path | Crop], captions: list[str], key: str, group: str = "") -> None:
        indices = []
        for source in sources:
            if source not in self.rows:
                path = source.path if isinstance(source, Crop) else source
                if not path.is_file():
                    raise DatasetError(f"{where}: image {path} not found")
                self.rows[source] = len(self.rows)
            indices.append(self.rows[source])
        self.item_images.append(indices)
        self.captions.append(captions)
        self.ds.item_keys.append(key)
        self.groups.append(group)

    def done(self, *, pad: bool = False) -> SelectionDataset:
        if not self.item_images:
            raise DatasetError(f"dataset {self.ds.name!r}: no items in {', '.join(map(str, self.ds.index_files))}")
        if pad:  # a rival repeated changes no rank-1 outcome; the caption entry encodes each text once
            width = max(map(len, self.captions))
            self.captions = [c + [c[-1]] * (width - len(c)) for c in self.captions]
        self.ds.sources, self.ds.captions = list(self.rows), self.captions
        self.ds.item_images = np.asarray(self.item_images, dtype=np.int64)
        if isinstance(self.ds, GroupedSelection):
            self.ds.item_groups = self.groups
        return self.ds


# --- COLA ------------------------------------------------------------------------------------------------------------

def load_cola(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    """COLA's multi-object set: pairs of images and captions, its strict text-to-image rule in ``image_acc``."""
    only_splits(name, split)
    ann = next((p for p in (root / COLA_FILE, root / "data" / COLA_FILE) if p.is_file()), root / COLA_FILE)
    entries = read_json(name, ann, f"COLA's data/{COLA_FILE}, {COLA_REPO}")
    if not isinstance(entries, list):
        raise DatasetError(f"dataset {name!r}: {ann} must hold a list of [image 1, caption 1, image 2, caption 2]")
    ds = SelectionDataset(name=name, split=split, task="image_caption_selection", index_files=[ann],
                          image_folder=root, strict=True)
    collected = ItemCollector(ds)
    for index, entry in enumerate(entries):
        if collected.full(limit):
            break
        if not (isinstance(entry, list) and len(entry) == 4 and all(isinstance(v, str) and v for v in entry)):
            raise DatasetError(f"{ann} entry {index}: expected [image 1 link, caption 1, image 2 link, caption 2]")
        images = [root / Path(*link.rstrip("/").split("/")[-2:]) for link in (entry[0], entry[2])]
        collected.add(f"{ann} entry {index}", list(images), [entry[1], entry[3]], str(index))
    return collected.done()


# --- CREPE -----------------------------------------------------------------------------------------------------------

def _crepe_files(name: str, root: Path) -> tuple[list[tuple[Path, str]], str]:
    """The CSV files of a CREPE set with each file's group, and the hard-negative column."""
    parts, f = name.split("/"), facts()
    if len(parts) == 3 and parts[1] == "productivity" and parts[2] in f["crepe_productivity_types"]:
        kind = parts[2]
        folder = next((d for d in (root / "prod_hard_negatives" / kind, root / kind) if d.is_dir()),
                      root / "prod_hard_negatives" / kind)
        return [(folder / f"prod_vg_hard_negs_{kind}_complexity_{n}.csv", f"complexity_{n}")
                for n in f["crepe_complexities"]], "hard_negs"
    if (len(parts) == 4 and parts[1] == "systematicity" and parts[2] in f["crepe_systematicity_types"]
            and parts[3] in f["crepe_train_datasets"]):
        folder = root / "syst_hard_negatives" if (root / "syst_hard_negatives").is_dir() else root
        return [(folder / f"syst_vg_hard_negs_{split}_in_{parts[3]}.csv", split)
                for split in f["crepe_compound_splits"]], f"valid_hard_negs_{parts[2]}"
    raise DatasetError(f"dataset {name!r}: CREPE's sets are {', '.join(crepe_names())}")


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def load_crepe(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    """A CREPE set: each row's box crop against its caption and hard negatives; recall@1 per file."""
    only_splits(name, split)
    files, column = _crepe_files(name, root)
    ds = GroupedSelection(name=name, split=split, task="image_caption_selection",
                          index_files=[p for p, _ in files], image_folder=root)
    collected = ItemCollector(ds)
    needed = {"image_id", "x", "y", "width", "height", "caption", column}
    for path, group in files:
        if not path.is_file():
            raise DatasetError(f"dataset {name!r}: {path} not found (CREPE's data/*_hard_negatives.zip unzipped "
                               f"under --dataset_root; {CREPE_REPO})")
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            missing = needed - set(reader.fieldnames or ())
            if missing:
                raise DatasetError(f"{path}: no column {', '.join(sorted(missing))}")
            for row_number, row in enumerate(reader, start=2):
                if collected.full(limit):
                    break
                where = f"{path} row {row_number}"
                box = [_number(row[k] or "") for k in ("x", "y", "width", "height")]
                negatives = quoted_list(row[column] or "")
                if not (negatives is not None and all(v is not None for v in box)
                        and (row["image_id"] or "").strip()):
                    raise DatasetError(f"{where}: expected an image_id, numeric x, y, width, height and a list of "
                                       f"strings in {column!r}")
                x, y, w, h = (v for v in box if v is not None)  # PIL rounds the box as TF.crop's ints give it
                image_id = row["image_id"].strip()
                image = next((p for p in (root / "VG_100K" / f"{image_id}.jpg", root / "VG_100K_2" / f"{image_id}.jpg")
                              if p.is_file()), root / "VG_100K" / f"{image_id}.jpg")
                crop = Crop(image, (x, y, x + w, y + h))
                collected.add(where, [crop], [str(row["caption"]), *negatives], f"{path.stem}#{row_number}", group)
    return collected.done(pad=True)


# --- VL-CheckList ----------------------------------------------------------------------------------------------------

def _corpus_yaml(name: str, yaml_path: Path) -> tuple[str, str]:
    import yaml

    try:
        config = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise DatasetError(f"dataset {name!r}: {yaml_path} not found (VL-CheckList's corpus/ folder copied into "
                           f"--dataset_root; {VL_CHECKLIST_REPO})") from e
    except yaml.YAMLError as e:
        raise DatasetError(f"dataset {name!r}: {yaml_path} is not YAML ({e})") from e
    if not (isinstance(config, dict) and isinstance(config.get("ANNO_PATH"), str)
            and isinstance(config.get("IMG_ROOT"), str)):
        raise DatasetError(f"{yaml_path}: expected ANNO_PATH and IMG_ROOT")
    return config["ANNO_PATH"], config["IMG_ROOT"]


def load_vl_checklist(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    """A VL-CheckList type: every corpus file under it, each entry its image against ``[NEG[0], POS[0]]``."""
    kind = name.split("/", 1)[1] if "/" in name else ""
    if kind not in facts()["vl_checklist_types"]:
        raise DatasetError(f"dataset {name!r}: VL-CheckList's types are {', '.join(vl_checklist_names())}")
    only_splits(name, split)
    corpus = facts()["vl_checklist_corpus"]
    files = [p for key in facts()["vl_checklist_types"][kind] for paths in corpus[key].values() for p in paths]
    yamls = {p: root / "corpus" / "v1" / f"{p}.yaml" for p in files}
    configs = {p: _corpus_yaml(name, y) for p, y in yamls.items()}
    ds = VlChecklistSelection(name=name, split=split, task="image_caption_selection", image_folder=root,
                              targets=(1,), strict=True, index_files=[*yamls.values(), *(root / a for a, _ in configs.values())])
    collected = ItemCollector(ds)
    for corpus_file, (anno, image_root) in configs.items():
        ann = root / anno
        entries = read_json(name, ann, f"VL-CheckList's {anno}, named by {yamls[corpus_file]}")
        if not isinstance(entries, list):
            raise DatasetError(f"dataset {name!r}: {ann} must hold a list of [image path, {{POS, NEG}}]")
        for index, entry in enumerate(entries):
            if collected.full(limit):
                break
            texts = entry[1] if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], dict) else {}
            pos, neg = texts.get("POS"), texts.get("NEG")
            if not (isinstance(entry[0] if texts else None, str) and isinstance(pos, list) and isinstance(neg, list)
                    and pos and neg and isinstance(pos[0], str) and isinstance(neg[0], str)):
                raise DatasetError(f"{ann} entry {index}: expected [image path, {{\"POS\": [text, ...], \"NEG\": "
                                   f"[text, ...]}}]")
            collected.add(f"{ann} entry {index}", [root / image_root / entry[0]], [neg[0], pos[0]],
                          f"{corpus_file}#{index}", corpus_file.replace("/", "_"))
    return collected.done()


# --- readers (registered in tasks/datasets/__init__.py) --------------------------------------------------------------

def _root(name: str, root: Path | None) -> Path:
    if root is None:
        raise DatasetError(f"dataset {name!r} needs --dataset_root (or data_dir): the folder holding the data")
    return root


class Cola(DatasetReader):
    task = "image_caption_selection"
    description = "COLA multi-object: COLA_multiobjects_matching_benchmark.json + vg_gqa_images/ (image_acc, strict)"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        return load_cola(name, _root(name, root), split, limit)


class Crepe(DatasetReader):
    task = "image_caption_selection"
    description = "CREPE: its hard-negative CSVs + VG_100K*/ (recall@1 = text_acc, per file text_acc:<group>)"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        return load_crepe(name, _root(name, root), split, limit)


class VlChecklist(DatasetReader):
    task = "image_caption_selection"
    description = "VL-CheckList: corpus/v1/ + data/ + vg/ swig/ hake/ (ITC accuracy per file, subtype, type)"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        return load_vl_checklist(name, _root(name, root), split, limit)
