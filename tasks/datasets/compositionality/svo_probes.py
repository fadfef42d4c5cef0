"""SVO-Probes (google-deepmind/svo_probes) on image-caption selection, scored as contrastive models are scored on it.

SVO-Probes' own Colab scores binary image-text-matching decisions (a sentence-image pair "matches" or not), which a
similarity model does not make. Contrastive models are evaluated on it as a pairwise choice instead: Bugliarello et
al. 2023, "Measuring Progress in Fine-grained Vision-and-Language Understanding" (e-bug/fine-grained-evals:
``models/CLIP/SVO.py`` writes each row's sentence-positive and sentence-negative cosine similarities,
``notebooks/SVO.ipynb`` scores them) count a row right when ``score(sentence, positive image) > score(sentence,
negative image)``, strictly, so a tie is a miss; overall over every row, and per negative type, the row's type being
``subj`` when ``subj_neg`` is true, else ``verb`` when ``verb_neg`` is, else ``obj`` (its ``if / elif / else``).

Layout under ``--dataset_root``:

- ``svo_probes.csv``: the repository's file (header row; the columns read are ``sentence``, ``pos_image_id``,
  ``neg_image_id``, ``subj_neg``, ``verb_neg``, ``obj_neg``; ``pos_triplet``, ``neg_triplet``, the URLs and a leading
  ``index`` column may be there and are not needed). Image ids are non-negative integers (the Colab's ``%d``), the
  flags ``True`` / ``False`` as pandas writes them (any case; ``1`` / ``0`` too).
- ``images/<image id>.jpg`` (or ``.jpeg``, ``.png``, looked for in that order): the pictures downloaded from
  ``pos_url`` / ``neg_url`` (``image_urls.txt`` lists them), named by the row's ``pos_image_id`` / ``neg_image_id``
  without padding (the reference's ``SVO.py`` opens ``<data_dir>/images/<file>``, by the names its own annotation
  file gives, which are not published with it).

Every row of the CSV is an item, in file order: images ``[positive, negative]``, captions ``[sentence]``. Many of
the URLs are dead; a missing image is an error naming the row and the id, so to evaluate the rows whose images you
have, delete the other rows from the CSV (the reference evaluated the rows its own ``annotations/test.jsonl`` kept,
its subset of the file; that file is not reproduced here).

Which number is the paper's: the sentence picks between two images, so it is the image side of the scorer:
``image_acc`` (every caption's best image is its own, scored ``strict``: the positive strictly above the negative)
is the paper's overall accuracy, and ``image_acc:subj`` / ``image_acc:verb`` / ``image_acc:obj`` its columns (each
a float64 mean over the group's rows, as its ``np.mean``; ``image_acc`` is a float32 mean like every selection set's,
equal to the float64 one within float32 rounding). With a single caption per item there is no rival caption, so
``text_acc`` is 1 by construction and ``acc`` (both sides) equals ``image_acc``; neither adds information here.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.datasets.compositionality.compositionality import only_splits
from clipcache.tasks.datasets.compositionality.compositionality_more import GroupedSelection, ItemCollector
from clipcache.tasks.datasets.reader import DatasetReader
from clipcache.tasks.datasets.selection import Crop

SVO_PROBES_REPO = "https://github.com/google-deepmind/svo_probes"
SVO_PROBES_FILE = "svo_probes.csv"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
NEGATIVE_TYPES = ("subj", "verb", "obj")  # the reference's columns, in its order
_COLUMNS = ("sentence", "pos_image_id", "neg_image_id", "subj_neg", "verb_neg", "obj_neg")
_FLAGS = {"true": True, "1": True, "false": False, "0": False}


@dataclass
class SvoProbesSelection(GroupedSelection):
    """SVO-Probes: the image-side accuracy per negative type (``image_acc:subj`` / ``:verb`` / ``:obj``), over the
    scored items of each type (a type with no scored item is left out)."""

    def group_metrics(self, samples: dict[str, np.ndarray]) -> dict[str, float]:
        labels = np.asarray(self.item_groups)[samples["sample_index"]]
        right = np.asarray(samples["image_right"], dtype=bool)
        return {f"image_acc:{g}": float(right[labels == g].mean()) for g in NEGATIVE_TYPES if (labels == g).any()}


def negative_type(subj_neg: bool, verb_neg: bool) -> str:
    """The reference's type of a row: subject if ``subj_neg``, else verb if ``verb_neg``, else object (a row with
    several flags, or none, falls where its ``if / elif / else`` puts it)."""
    return "subj" if subj_neg else "verb" if verb_neg else "obj"


def find_image(images: Path, image_id: int) -> Path | None:
    """``images/<id>.jpg``, ``.jpeg`` or ``.png``, the first that exists."""
    return next((p for p in (images / f"{image_id}{ext}" for ext in IMAGE_EXTENSIONS) if p.is_file()), None)


def _image_id(value: str | None) -> int | None:
    text = (value or "").strip()
    return int(text) if text.isascii() and text.isdigit() else None


def load_svo_probes(name: str, root: Path, split: str, limit: int | None) -> SvoProbesSelection:
    """Every row of ``svo_probes.csv``: images ``[positive, negative]`` against its sentence; grouped by negative
    type. ``limit`` keeps the first rows."""
    only_splits(name, split)
    table, images = root / SVO_PROBES_FILE, root / "images"
    if not table.is_file():
        raise DatasetError(f"dataset {name!r}: {table} not found (SVO-Probes' {SVO_PROBES_FILE}, {SVO_PROBES_REPO})")
    if not images.is_dir():
        raise DatasetError(f"dataset {name!r}: {images}/ not found (the images downloaded from the CSV's pos_url / "
                           f"neg_url, saved as images/<image id>.jpg)")
    ds = SvoProbesSelection(name=name, split=split, task="image_caption_selection", index_files=[table],
                            image_folder=images, strict=True)
    collected = ItemCollector(ds)
    with open(table, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise DatasetError(f"{table}: no column {', '.join(missing)} (SVO-Probes' header names "
                               f"{', '.join(_COLUMNS)})")
        for position, row in enumerate(reader):
            if collected.full(limit):
                break
            where = f"{table} line {reader.line_num} (data row {position})"
            pos_id, neg_id = _image_id(row["pos_image_id"]), _image_id(row["neg_image_id"])
            flags = [_FLAGS.get((row[k] or "").strip().lower()) for k in ("subj_neg", "verb_neg", "obj_neg")]
            sentence = row["sentence"] or ""  # as written: the reference tokenizes the file's text
            if not sentence.strip() or pos_id is None or neg_id is None or None in flags:
                raise DatasetError(f"{where}: expected a sentence, integer pos_image_id and neg_image_id, and "
                                   f"True/False in subj_neg, verb_neg, obj_neg")
            paths: list[Path | Crop] = []
            for side, image_id in (("pos", pos_id), ("neg", neg_id)):
                path = find_image(images, image_id)
                if path is None:
                    raise DatasetError(f"{where}: image {image_id} ({side}_image_id) not found as "
                                       f"{images}/{image_id}{'|'.join(IMAGE_EXTENSIONS)}")
                paths.append(path)
            key = (row.get("index") or "").strip() or str(position)
            collected.add(where, paths, [sentence], key, negative_type(bool(flags[0]), bool(flags[1])))
    collected.done()
    return ds


class SvoProbes(DatasetReader):
    task = "image_caption_selection"
    description = ("SVO-Probes: svo_probes.csv + images/<image id>.jpg|.jpeg|.png (sentence picks the positive image: "
                   "image_acc, strict; image_acc:subj|verb|obj)")

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        if root is None:
            raise DatasetError(f"dataset {name!r} needs --dataset_root (or data_dir): the folder holding "
                               f"{SVO_PROBES_FILE} and images/")
        return load_svo_probes(name, root, split, limit)
