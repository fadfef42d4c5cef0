"""Image-caption selection data: clip_benchmark's SugarCrepe and Winoground, read from their local copies.

Each item has a few images and a few captions, and the i-th image belongs with the i-th caption. The dataset
indexes the distinct images once (SugarCrepe items share COCO images) with ``item_images`` (items x images per item)
pointing into them; ``captions`` holds each item's captions, so the caption entry encodes every distinct text once.

- ``sugar_crepe/<add_att|add_obj|replace_att|replace_obj|replace_rel|swap_att|swap_obj>``: ``--dataset_root`` holds
  ``val2017/`` (COCO 2017 validation images) and ``<task>.json`` (the SugarCrepe file: ``{"<id>": {"filename",
  "caption", "negative_caption"}}``), as clip_benchmark lays them out. Items are in the file's key order; the
  captions are ``[caption, negative_caption]``.
- ``winoground``: ``--dataset_root`` is the ``cache_dir`` clip_benchmark gave ``datasets.load_dataset
  ("facebook/winoground", cache_dir=root)``; its Arrow files are read with pyarrow (no network, no ``datasets``), or a
  folder of the hub repository's Parquet files. Items are ``[image_0, image_1]`` with ``[caption_0, caption_1]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import EvalDataset

SUGAR_CREPE_TASKS = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
SUGAR_CREPE_JSON = "https://raw.githubusercontent.com/RAIVNLab/sugar-crepe/main/data/{task}.json"
COCO_VAL2017 = "http://images.cocodataset.org/zips/val2017.zip"
WINOGROUND_REPO = "facebook/winoground"


class Crop(NamedTuple):
    """An image source that is a box of a file, cut out before preprocessing (ARO's Visual Genome sets):
    ``box`` is PIL's ``(left, upper, right, lower)``."""

    path: Path
    box: tuple[float, float, float, float]


@dataclass
class SelectionDataset(EvalDataset):
    item_images: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.int64))
    sources: list[Any] = field(default_factory=list)  # per distinct image: a Path, a Crop, or (arrow file, row, column)
    item_keys: list[str] = field(default_factory=list)  # per item, its id in the dataset's files
    index_files: list[Path] = field(default_factory=list)
    image_folder: Path | None = None
    # the caption index of each of an item's images (same for every item); None: image j's caption is caption j
    targets: tuple[int, ...] | None = None
    # per item, its group (ARO's relation or attribute pair): ``macro_acc`` averages the groups' text accuracies over
    # groups with at least ``macro_min_count`` items, leaving out ``macro_exclude``
    groups: list[str] | None = None
    macro_exclude: frozenset[str] = frozenset()
    macro_min_count: int = 1
    strict: bool = False  # a tie is a miss on either side (COLA), not decided by the first index
    _tables: dict[Path, Any] = field(default_factory=dict, repr=False)

    @property
    def n_items(self) -> int:
        return len(self.item_images)

    def __len__(self) -> int:  # what the image encoder walks: the distinct images
        return len(self.sources)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        ident: dict[str, Any] = {"format": f"selection:{self.name}",
                                 "index": [memo.sha256(p) for p in self.index_files]}
        paths = list(dict.fromkeys(s.path if isinstance(s, Crop) else s for s in self.sources
                                   if isinstance(s, Path | Crop)))
        if paths:
            ident["images"] = memo.fingerprint(paths, root=self.image_folder)
        if any(isinstance(s, Crop) for s in self.sources):  # the boxes are in the index files; said here too
            from clipcache.storage.hashing import digest

            ident["crops"] = digest([list(s.box) if isinstance(s, Crop) else None for s in self.sources])
        return ident

    def group_metrics(self, samples: dict[str, np.ndarray]) -> dict[str, float]:
        """Sub-scores a set's reference reports (per type, per subtype), from the scored items' outcomes
        (``samples``, with each item's ``sample_index``); named ``<metric>:<group>``. None by default."""
        return {}

    def describe(self, index: int) -> str:
        source = self.sources[index]
        if isinstance(source, Path):
            return str(source)
        if isinstance(source, Crop):
            return f"{source.path} (box {list(source.box)})"
        file, row, column = source
        return f"{file} row {row} column {column}"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tables": {}}  # a decoding worker process reads the tables it needs itself

    def read_image_bytes(self, index: int) -> bytes | Image.Image:
        source = self.sources[index]
        if isinstance(source, Path):
            return source.read_bytes()
        if isinstance(source, Crop):  # decoded, converted to RGB, then cropped: the order ARO's readers use
            try:
                with Image.open(source.path) as img:
                    return img.convert("RGB").crop(source.box)
            except Exception as e:  # PIL raises many types for bad data
                raise DatasetError(f"image does not decode: {self.describe(index)} ({type(e).__name__}: {e})") from e
        file, row, column = source
        if file not in self._tables:
            self._tables[file] = _read_table(file)
        value = self._tables[file].column(column)[row].as_py()
        data = value.get("bytes") if isinstance(value, dict) else value
        if not data:
            raise DatasetError(f"{self.describe(index)}: no image bytes")
        return data


def load_sugar_crepe(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    task = name.split("/", 1)[1] if "/" in name else ""
    if task not in SUGAR_CREPE_TASKS:
        raise DatasetError(f"dataset {name!r}: SugarCrepe's tasks are {', '.join(SUGAR_CREPE_TASKS)}")
    if split != "test":
        raise DatasetError(f"dataset {name!r} has only the 'test' split (asked for {split!r})")
    ann = root / f"{task}.json"
    images = root / "val2017"
    if not ann.is_file():
        raise DatasetError(f"dataset {name!r}: {ann} not found (clip_benchmark fetches it from "
                           f"{SUGAR_CREPE_JSON.format(task=task)})")
    if not images.is_dir():
        raise DatasetError(f"dataset {name!r}: {images}/ not found (the COCO 2017 validation images; clip_benchmark "
                           f"unzips {COCO_VAL2017} there)")
    try:
        items = json.loads(ann.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"dataset {name!r}: {ann} is not a JSON file ({e})") from e
    if not isinstance(items, dict) or not items:
        raise DatasetError(f"dataset {name!r}: {ann} must hold an object of items keyed by id")
    captions: list[list[str]] = []
    ds = SelectionDataset(name=name, split=split, task="image_caption_selection", captions=captions, index_files=[ann],
                          image_folder=images)
    rows: dict[Path, int] = {}
    item_images: list[list[int]] = []
    for key, item in list(items.items())[:limit]:
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str)
                                                 for k in ("filename", "caption", "negative_caption")):
            raise DatasetError(f"{ann} item {key!r}: expected strings 'filename', 'caption' and 'negative_caption'")
        path = images / item["filename"]
        if path not in rows:
            if not path.is_file():
                raise DatasetError(f"{ann} item {key!r}: image {path} not found")
            rows[path] = len(rows)
        item_images.append([rows[path]])
        captions.append([item["caption"], item["negative_caption"]])
        ds.item_keys.append(str(key))
    ds.sources = list(rows)
    ds.item_images = np.asarray(item_images, dtype=np.int64)
    return ds


def _read_table(file: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if file.suffix == ".parquet":
            return pq.read_table(file)
        with pa.memory_map(str(file)) as source:
            return pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{file}: not a readable {'Parquet' if file.suffix == '.parquet' else 'Arrow'} file "
                           f"({e})") from e


def winoground_files(root: Path) -> list[Path]:
    """The test split's files in a local copy: the newest datasets-cache version, else the repository's Parquet."""
    cached = sorted((root / "facebook___winoground").glob("*/*/*/dataset_info.json"), key=lambda p: p.stat().st_mtime)
    if cached:
        folder = cached[-1].parent
        return sorted(folder.glob("*-test.arrow")) + sorted(folder.glob("*-test-*-of-*.arrow"))
    return sorted(p for p in root.rglob("*.parquet") if "test" in p.name)


def load_winoground(name: str, root: Path, split: str, limit: int | None) -> SelectionDataset:
    if split != "test":
        raise DatasetError(f"dataset {name!r} has only the 'test' split (asked for {split!r})")
    files = winoground_files(root)
    if not files:
        raise DatasetError(f"dataset {name!r}: no local copy of {WINOGROUND_REPO} under {root} (expected the "
                           f"datasets cache clip_benchmark makes there, facebook___winoground/..., or the "
                           f"repository's test Parquet files; it is gated: accept its terms on Hugging Face and "
                           f"download it with `hf download {WINOGROUND_REPO} --repo-type dataset --local-dir {root}`)")
    texts: list[list[str]] = []
    ds = SelectionDataset(name=name, split=split, task="image_caption_selection", captions=texts, index_files=files)
    item_images: list[list[int]] = []
    for file in files:
        table = _read_table(file)
        missing = {"image_0", "image_1", "caption_0", "caption_1"} - set(table.column_names)
        if missing:
            raise DatasetError(f"{file}: not Winoground data (no column {', '.join(sorted(missing))})")
        captions = zip(table.column("caption_0").to_pylist(), table.column("caption_1").to_pylist(), strict=True)
        ids = table.column("id").to_pylist() if "id" in table.column_names else [f"{file.name}#{r}"
                                                                                for r in range(table.num_rows)]
        for row, pair in enumerate(captions):
            if limit is not None and len(item_images) >= limit:
                break
            first = len(ds.sources)
            ds.sources += [(file, row, "image_0"), (file, row, "image_1")]
            item_images.append([first, first + 1])
            texts.append(list(pair))
            ds.item_keys.append(str(ids[row]))
    if not item_images:
        raise DatasetError(f"dataset {name!r}: {files[0]} has no items")
    ds.item_images = np.asarray(item_images, dtype=np.int64)
    return ds
