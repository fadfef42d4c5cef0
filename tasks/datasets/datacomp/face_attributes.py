"""FairFace and UTKFace as DataComp evaluates them (its ``eval_utils/fairness_eval.py``): every face is classified
by four zero-shot heads at once (race, gender, age and a "toxic" head of crime / non-human labels), and its
metadata vector (age, gender, race, race_binary) groups the outcomes (tasks/suites/face_attributes.py).

Read from DataComp's webdataset copies (``download_evalsets.py``: Hugging Face ``djghosh/wds_fairness-fairface_test``
and ``wds_fairness-utkface_test``): ``classnames.txt`` lines are ``objective:classname`` and
``zeroshot_classification_templates.txt`` lines ``objective:template``; each sample holds an image and
``<key>.npy``, the metadata vector (a ``.cls`` member, if any, is not read: DataComp does not read it either). The
metadata is read as data: a non-object ``.npy`` only, an object array (a pickle) is refused in one line.

Or from the original releases (FairFace's ``fairface_label_val.csv`` and images, UTKFace's ``[age]_[gender]_[race]_
[date&time].jpg`` files), coded as DataComp's copy is by tasks/datasets/datacomp/group_originals.py, with DataComp's
``objective:`` prompts in the root: :class:`FaceAttributesImages`. Both kinds are a :class:`FaceAttributesDataset`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import ClassPrompts
from clipcache.tasks.datasets.clip_benchmark.wds import WebDataset, index_shard, read_prompts
from clipcache.tasks.datasets.datacomp.group_layouts import (
    GroupedImages,
    GroupedWebDataset,
    _check_codes,
    group_layouts,
)


@dataclass(frozen=True)
class Head:
    """One objective's zero-shot classifier: its class names and templates (``{c}`` format strings)."""

    objective: str
    classnames: list[str]
    templates: list[str]

    def prompts(self) -> list[str]:
        """Class-major: row ``c * len(templates) + t`` is ``templates[t].format(c=classnames[c])``."""
        return [t.format(c=c) for c in self.classnames for t in self.templates]


def split_heads(prompts: ClassPrompts, objectives: list[str], dataset: str) -> list[Head]:
    """The prompts of each objective, in ``objectives``' order, from ``objective:...`` class names and templates;
    a line of another objective, a line without one, or an objective without classes or templates is a
    DatasetError naming it."""
    names: dict[str, list[str]] = {o: [] for o in objectives}
    templates: dict[str, list[str]] = {o: [] for o in objectives}
    for what, lines, into in (("class name", prompts.classnames, names), ("template", prompts.templates, templates)):
        for line in lines:
            objective, sep, text = line.partition(":")
            if not sep or objective not in into:
                raise DatasetError(f"dataset {dataset!r}: {what} {line!r} ({prompts.source}) is not "
                                   f"'<objective>:<text>' with an objective of {', '.join(objectives)}")
            into[objective].append(text)
    for objective in objectives:
        if not names[objective] or not templates[objective]:
            raise DatasetError(f"dataset {dataset!r}: objective {objective!r} has {len(names[objective])} class "
                               f"names and {len(templates[objective])} templates ({prompts.source}); DataComp's "
                               f"copy has both for each of {', '.join(objectives)}")
    return [Head(o, names[o], templates[o]) for o in objectives]


class FaceAttributesDataset:
    """FairFace / UTKFace in any layout: images, ``objective:`` prompts and each sample's metadata vector (the
    evaluation's face_attributes task reads any dataset of this kind)."""

    name: str
    prompts: ClassPrompts | None
    objectives: tuple[str, ...]

    def heads(self, prompts: ClassPrompts | None = None) -> list[Head]:
        chosen = prompts if prompts is not None else self.prompts
        if chosen is None:
            raise DatasetError(f"dataset {self.name!r} has no class names and templates to classify with")
        return split_heads(chosen, list(self.objectives), self.name)


@dataclass
class FaceAttributesWebDataset(FaceAttributesDataset, GroupedWebDataset):
    """DataComp's webdataset copy of FairFace / UTKFace."""

    objectives: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class FaceAttributesImages(FaceAttributesDataset, GroupedImages):
    """FairFace / UTKFace in their original layouts (image files; tasks/datasets/datacomp/group_originals.py)."""

    objectives: tuple[str, ...] = field(default_factory=tuple)


def load_face_attributes(name: str, root: Path, split: str, limit: int | None) -> FaceAttributesWebDataset:
    """DataComp's webdataset copy of FairFace / UTKFace under ``root``."""
    entry = group_layouts()[name]
    fields = tuple(entry["fields"])
    nshards_path = root / split / "nshards.txt"
    try:
        nshards = int(nshards_path.read_text().strip())
    except (OSError, ValueError) as e:
        raise DatasetError(f"dataset {name!r}: {nshards_path} must hold the number of shards ({e})") from e
    shards = [root / split / f"{i}.tar" for i in range(nshards)]
    base = WebDataset(name=name, split=split, task="zeroshot_classification", root=root, shards=shards)
    vectors: list[np.ndarray] = []
    for shard_id, shard in enumerate(shards):
        if limit is not None and len(base.members) >= limit:
            break
        if not shard.exists():
            raise DatasetError(f"dataset {name!r}: shard {shard} is missing ({nshards_path} says {nshards} shards)")
        # the metadata vector is the member indexed as the label: read by read_npy (object arrays refused)
        index_shard(base, shard_id, shard, "npy", labels=vectors, captions=[], limit=limit)
    if not base.members:
        raise DatasetError(f"dataset {name!r}: {root / split} has no samples")
    bad = next((i for i, v in enumerate(vectors) if len(v) != len(fields)), None)
    if bad is not None:
        raise DatasetError(f"dataset {name!r}: {base.describe(bad)} has {len(vectors[bad])} metadata values, "
                           f"{name} has {len(fields)} ({', '.join(fields)})")
    codes = _check_codes(np.vstack(vectors).astype(np.float64), fields, str(root / split))
    base.prompts = read_prompts(root, name)
    state = {k: v for k, v in base.__dict__.items() if k != "_handles"}
    ds = FaceAttributesWebDataset(**state, fields=fields, codes=codes, objectives=tuple(entry["heads"]))
    ds.heads()  # the prompts name every objective: checked before anything is encoded
    return ds
