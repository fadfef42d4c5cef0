"""Birdsnap (``--dataset birdsnap``) as InternVL's clip_benchmark fork reads it (its ``BirdsnapV2``); LAION
clip_benchmark has no Birdsnap.

Under ``--dataset_root``:

- ``test_images_valid.txt``: a header line, then one image per line, ``<Species folder>/<file>`` relative to the root
  (the images that could still be downloaded);
- ``species.txt``: tab-separated with a header line (Birdsnap's ``id  common  scientific  dir``); row ``i`` is class
  ``i``, named by its second column (the common name) and found by its last (the folder name);
- the images, at the paths the first file lists.

As the fork reads them: lines lose only their ``\\n``; an image's label is the row of ``species.txt`` whose last
column equals the image's first path component lower-cased (a later row wins a repeated folder name); only the test
split exists. Templates are the fork's for ``birdsnap``. Nothing is downloaded: a missing file is named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import ClassPrompts
from clipcache.tasks.datasets.clip_benchmark.original import FolderImages

IMAGES_FILE = "test_images_valid.txt"
SPECIES_FILE = "species.txt"
# en_zeroshot_classification_templates.json of InternVL's fork, key "birdsnap"
TEMPLATES = ["a photo of a {c}, a type of bird."]
SOURCE = "InternVL's clip_benchmark fork (github.com/OpenGVLab/InternVL, clip_benchmark/; BirdsnapV2)"
LAYOUT = "birdsnap-internvl"


def is_birdsnap_folder(name: str, entry: Any, root: Path, split: str) -> bool:
    return (Path(root) / IMAGES_FILE).is_file()


def _lines(path: Path, name: str) -> list[str]:
    if not path.is_file():
        raise DatasetError(f"dataset {name!r}: {path} not found (the Birdsnap lists {SOURCE} reads; Birdsnap's "
                           f"images from http://thomasberg.org/datasets/birdsnap/1.1/birdsnap.tgz)")
    try:
        with path.open(encoding="utf-8") as f:  # universal newlines, as the fork opens it
            lines = [line.rstrip("\n") for line in f]
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start + 1})") from e
    if len(lines) < 2:
        raise DatasetError(f"dataset {name!r}: {path} has no rows after its header line")
    return lines[1:]


def _species(path: Path, name: str) -> tuple[list[str], dict[str, int]]:
    """(class names, folder -> class index) from species.txt's rows."""
    classes: list[str] = []
    folders: dict[str, int] = {}
    for n, line in enumerate(_lines(path, name), start=2):
        columns = line.split("\t")
        if len(columns) < 2:
            raise DatasetError(f"{path} line {n}: expected tab-separated columns (id, common name, ..., folder)")
        folders[columns[-1]] = len(classes)
        classes.append(columns[1])
    return classes, folders


def load_birdsnap(name: str, entry: Any, root: Path, split: str, limit: int | None, **_: Any) -> FolderImages:
    """The fork's ``BirdsnapV2(root, split='test')``: the listed images in file order, labelled through species.txt."""
    root = Path(root)
    classes, folders = _species(root / SPECIES_FILE, name)
    listed = _lines(root / IMAGES_FILE, name)[:limit]
    labels = []
    for n, image in enumerate(listed, start=2):
        label = folders.get(image.split("/")[0].lower())
        if label is None:
            raise DatasetError(f"{root / IMAGES_FILE} line {n}: {image!r} is in folder {image.split('/')[0]!r}, "
                               f"which no row of {SPECIES_FILE} names (its last column, lower case)")
        labels.append(label)
    paths = [root / image for image in listed]
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:
        raise DatasetError(f"dataset {name!r}: image {missing} (named in {IMAGES_FILE}) not found")
    prompts = ClassPrompts(classes, list(TEMPLATES), "en", f"{root / SPECIES_FILE} ({SOURCE})")
    return FolderImages(name=name, split=split, task="zeroshot_classification",
                        labels=np.asarray(labels, dtype=np.int64), prompts=prompts, paths=paths, root=root,
                        layout=LAYOUT)
