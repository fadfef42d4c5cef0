"""DataComp's evaluation sets with per-sample metadata: WILDS iWildCam, Camelyon17 and FMoW, Dollar Street, GeoDE,
FairFace and UTKFace (the table is group_layouts.json; FairFace and UTKFace, four zero-shot heads per face, are
read by face_attributes.py beside this module). Each sample carries its metadata (WILDS locations, slides, regions,
years; Dollar Street income groups; GeoDE regions), which the evaluation stores once per dataset identity
(storage/sample_metadata.py) and groups its sample rows by (tasks/suites/groups.py).

Layouts read, under ``--dataset_root`` (a folder, or a template such as ``/data/wds_{dataset_cleaned}_test``):

- DataComp's webdataset copies (its ``download_evalsets.py``: Hugging Face ``djghosh/wds_<name>_test``): the
  clip_benchmark layout (classnames.txt, zeroshot_classification_templates.txt, ``<split>/nshards.txt``,
  ``<split>/N.tar``) whose samples hold ``<key>.cls`` (the class) and ``<key>.npy`` (the metadata vector, in the
  order of group_layouts.json's ``fields``). A ``<key>.pyd`` / ``<key>.pickle`` vector is read by the restricted
  unpickler (tasks/datasets/safe_pickle.py), an object ``.npy`` is refused: metadata is data, never code.
- The WILDS package's own folders, where group_layouts.json says how (iWildCam ``iwildcam_v2.0/metadata.csv``,
  Camelyon17 ``camelyon17_v1.0/metadata.csv``): the CSV read as text, the fields of DataComp's vector made from
  its columns. WILDS has no prompts: ``classnames.txt`` and ``zeroshot_classification_templates.txt`` (DataComp's,
  from its copy) must sit in the root.
- The original published layouts of FMoW (WILDS' ``fmow_v1.1/``), GeoDE (``index.csv``), Dollar Street (MLCommons'
  ``images_v2_imagenet_test.csv``), FairFace (``fairface_label_val.csv``) and UTKFace (``UTKFace/<age>_<gender>_
  <race>_<time>.jpg``), read by tasks/datasets/datacomp/group_originals.py under the rules of group_layouts.json's
  ``original`` entries, into the codes (and class indices) of DataComp's copy; prompts as for the WILDS folders.

The first layout found under the root is read, in the order above (DataComp's copy, WILDS' CSV, the original).
"""

from __future__ import annotations

import csv
import io
import pickle
import tarfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.sample_metadata import SampleMetadata
from clipcache.tasks.datasets.clip_benchmark.wds import WebDataset, load_webdataset, read_npy, read_prompts, split_key
from clipcache.tasks.datasets.datacomp import group_layout_table as group_layouts
from clipcache.tasks.datasets.datacomp.group_originals import original_folder, read_original
from clipcache.tasks.datasets.labelled import LabelledImages
from clipcache.tasks.datasets.record import DatasetRecord
from clipcache.tasks.datasets.safe_pickle import DatasetUnpickler, RefusedGlobal
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource, OpenOptions

if TYPE_CHECKING:
    from clipcache.tasks.datasets.base import EvalDataset

METADATA_EXTENSIONS = ("npy", "pyd", "pickle")


def _labels(name: str) -> dict[str, dict[int, str]]:
    return {f: dict(enumerate(names)) for f, names in group_layouts()[name].get("labels", {}).items()}


@dataclass
class GroupedWebDataset(WebDataset):
    """A webdataset copy whose samples carry a metadata vector: ``codes[i]`` is sample i's, fields in order."""

    fields: tuple[str, ...] = ()
    codes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))

    def sample_metadata(self) -> SampleMetadata:
        keys = [self.sample_key(i) for i in range(len(self))]
        return SampleMetadata(self.name, self.split, "datacomp_wds", keys,
                              {f: self.codes[:, j] for j, f in enumerate(self.fields)}, _labels(self.name))


@dataclass
class GroupedImages(LabelledImages):
    """Image files with their metadata (the WILDS folders)."""

    fields: tuple[str, ...] = ()
    codes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    layout: str = "wilds_csv"

    def sample_metadata(self) -> SampleMetadata:
        keys = [self.sample_key(i) for i in range(len(self))]
        return SampleMetadata(self.name, self.split, self.layout, keys,
                              {f: self.codes[:, j] for j, f in enumerate(self.fields)}, _labels(self.name))


def _vector(raw: bytes, ext: str, where: str) -> np.ndarray:
    """A metadata member as a 1-D array of numbers; a pickle that names anything but NumPy arrays and plain
    containers, an object array, or a non-number is one DatasetError naming the member."""
    if ext == "npy":
        value: Any = read_npy(raw, where)
    else:
        try:
            value = DatasetUnpickler(io.BytesIO(raw), encoding="latin1").load()
        except RefusedGlobal as e:
            raise DatasetError(f"{where}: refused to load {e.qualified_name!r} from a pickle (clipcache loads only "
                               f"NumPy arrays and plain containers from dataset pickles)") from e
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
            raise DatasetError(f"{where}: not a readable pickle of a metadata vector ({e})") from e
    try:
        array = np.asarray(value).reshape(-1)
    except (TypeError, ValueError) as e:
        raise DatasetError(f"{where}: not a metadata vector of numbers") from e
    if array.dtype.kind not in "iufb":
        raise DatasetError(f"{where}: metadata must be numbers (got {array.dtype})")
    return array


def _metadata_members(ds: WebDataset) -> dict[tuple[int, str], tuple[bytes, str]]:
    """(shard, key) -> (metadata member bytes, extension), for the shards the dataset reads."""
    found: dict[tuple[int, str], tuple[bytes, str]] = {}
    for shard_id, shard in enumerate(ds.shards_used()):
        try:
            with tarfile.open(shard, mode="r:") as tar:
                for info in tar:
                    key, ext = split_key(info.name)
                    if info.isfile() and ext in METADATA_EXTENSIONS:
                        member = tar.extractfile(info)
                        found[(shard_id, key)] = (member.read() if member is not None else b"", ext)
        except (tarfile.TarError, OSError) as e:
            raise DatasetError(f"shard {shard} is not a readable tar file: {e}") from e
    return found


def _check_codes(codes: np.ndarray, fields: tuple[str, ...], where: str) -> np.ndarray:
    if not np.all(np.isfinite(codes)) or not np.all(codes == np.round(codes)) or (codes < 0).any():
        raise DatasetError(f"{where}: metadata values must be whole numbers >= 0 (group indices of "
                           f"{', '.join(fields)})")
    return codes.astype(np.int64)


def load_grouped_webdataset(name: str, root: Path, split: str, limit: int | None) -> GroupedWebDataset:
    """DataComp's webdataset copy of ``name``: classes from ``.cls``, metadata from ``.npy`` (or a pickle)."""
    base = load_webdataset(name, root, split, limit)
    fields = tuple(group_layouts()[name]["fields"])
    members = _metadata_members(base)
    rows = []
    for m in base.members:
        key = split_key(m.name)[0]
        where = f"{base.shards[m.shard]} member {key}"
        if (m.shard, key) not in members:
            raise DatasetError(f"{where}: no metadata member ({key}.npy); DataComp's copy of {name} "
                               f"({group_layouts()[name]['datacomp_folder']}) has one per sample")
        raw, ext = members[(m.shard, key)]
        vector = _vector(raw, ext, f"{where}.{ext}")
        if len(vector) != len(fields):
            raise DatasetError(f"{where}.{ext}: {len(vector)} metadata values, {name} has {len(fields)} "
                               f"({', '.join(fields)})")
        rows.append(vector)
    codes = _check_codes(np.vstack(rows).astype(np.float64), fields, str(root / split))
    state = {k: v for k, v in base.__dict__.items() if k != "_handles"}
    return GroupedWebDataset(**state, fields=fields, codes=codes)


def _field_value(row: dict[str, str], column: str, where: str) -> str:
    source, _, part = column.partition(":")
    if source not in row:
        raise DatasetError(f"{where}: no column {source!r}")
    value = row[source].strip()
    if not part:
        return value
    for pattern in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S"):
        try:
            return str(getattr(datetime.strptime(value, pattern), part))
        except ValueError:
            continue
    raise DatasetError(f"{where}: column {source!r} value {value!r} is not a date and time (YYYY-MM-DD HH:MM:SS)")


def load_wilds_folder(name: str, root: Path, split: str, limit: int | None) -> GroupedImages:
    """The WILDS package's folder of ``name``: its metadata CSV, read as text, and the images it names."""
    spec = group_layouts()[name]["wilds"]
    folder = root / spec["folder"]
    csv_path = folder / spec["csv"]
    fields = tuple(group_layouts()[name]["fields"])
    wanted = str(spec.get("splits", {}).get(split, split))
    ds = GroupedImages(name=name, split=split, task="zeroshot_classification", root=folder, fields=fields)
    labels: list[int] = []
    rows: list[list[int]] = []
    try:
        with open(csv_path, encoding="utf-8-sig", newline="") as f:
            for line_no, row in enumerate(csv.DictReader(f), start=2):
                where = f"{csv_path} line {line_no}"
                if row.get(spec["split_column"], "").strip() != wanted:
                    continue
                if limit is not None and len(labels) >= limit:
                    break
                try:
                    values = [int(float(_field_value(row, spec["columns"][f], where))) for f in fields]
                    labels.append(int(row[spec["label"]]))
                    image = folder / spec["image"].format(**{k: (v or "").strip() for k, v in row.items() if k})
                except (KeyError, ValueError) as e:
                    raise DatasetError(f"{where}: not a row of WILDS' {name} metadata ({e})") from e
                rows.append(values)
                ds.image_paths.append(image)
                ds.origins.append(where)
    except OSError as e:
        raise DatasetError(f"dataset {name!r}: cannot read {csv_path} ({e.strerror})") from e
    if not rows:
        raise DatasetError(f"dataset {name!r}: {csv_path} has no row of split {split!r} "
                           f"({spec['split_column']} = {wanted})")
    ds.labels = np.asarray(labels, dtype=np.int64)
    ds.codes = _check_codes(np.asarray(rows, dtype=np.float64), fields, str(csv_path))
    ds.prompts = read_prompts(root, name)
    missing = next((p for p in ds.image_paths if not p.is_file()), None)
    if missing is not None:
        raise DatasetError(f"dataset {name!r}: {missing} is missing (named by {csv_path})")
    return ds


def load_original(name: str, root: Path, folder: Path, split: str, limit: int | None) -> GroupedImages:
    """``name`` in its original published layout under ``folder`` (group_layouts.json's ``original`` entry), with
    DataComp's prompts from ``root``; FairFace and UTKFace come back with their four heads."""
    entry = group_layouts()[name]
    spec = entry["original"]
    fields = tuple(entry["fields"])
    prompts = read_prompts(root, name)
    try:
        rows = read_original(spec, fields, folder, split, limit, None if "heads" in entry else prompts)
    except DatasetError as e:
        raise DatasetError(f"dataset {name!r}: {e}") from e
    state: dict[str, Any] = {"name": name, "split": split, "task": "zeroshot_classification", "root": folder,
                             "image_paths": rows.images, "origins": rows.origins, "prompts": prompts,
                             "fields": fields, "layout": spec["layout"],
                             "codes": _check_codes(np.asarray(rows.codes, np.float64), fields, str(folder))}
    if "heads" in entry:  # FairFace, UTKFace: no class, four zero-shot heads
        from clipcache.tasks.datasets.datacomp.face_attributes import FaceAttributesImages

        faces = FaceAttributesImages(**state, objectives=tuple(entry["heads"]))
        faces.heads()  # the prompts name every objective: checked before anything is encoded
        return faces
    labels = np.asarray(rows.labels, dtype=np.int64)
    bad = np.flatnonzero(labels >= len(prompts.classnames))
    if len(bad):
        raise DatasetError(f"dataset {name!r}: {rows.origins[bad[0]]} has class {int(labels[bad[0]])}, outside "
                           f"the {len(prompts.classnames)} classes of {root / 'classnames.txt'}")
    return GroupedImages(**state, labels=labels)


def _where(name: str) -> str:
    entry = group_layouts()[name]
    places = [f"DataComp's webdataset copy ({entry['datacomp_folder']}: <split>/nshards.txt)"]
    if "wilds" in entry:
        places.append(f"the WILDS folder {entry['wilds']['folder']}/{entry['wilds']['csv']}")
    if "original" in entry:
        spec = entry["original"]
        held = spec["files"]["glob"] if "files" in spec else spec.get("table") or spec["tables"]["test"]
        places.append(f"the original layout ({' or '.join(f'{f}/{held}' for f in spec['folder'])})")
    return " or ".join(places)


class GroupLayouts(DatasetSource):
    name = "group_layouts"
    description = ("DataComp's WILDS and fairness sets with per-sample metadata (wilds/iwildcam, fairness/geode, "
                   "fairness/fairface, ...): its webdataset copies, WILDS' folders or the original releases under "
                   "--dataset_root")
    priority = 25

    def claims(self, ref: DatasetRef) -> bool:
        return ref.name in group_layouts()

    def task(self, ref: DatasetRef) -> str:
        return str(group_layouts()[ref.name].get("task", "zeroshot_classification"))

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> EvalDataset:
        root = ref.folder(_where(ref.name))
        if (root / split / "nshards.txt").is_file():
            if "heads" in group_layouts()[ref.name]:  # FairFace, UTKFace: four zero-shot heads per face
                from clipcache.tasks.datasets.datacomp.face_attributes import load_face_attributes

                return load_face_attributes(ref.name, root, split, limit)
            return load_grouped_webdataset(ref.name, root, split, limit)
        wilds = group_layouts()[ref.name].get("wilds")
        if wilds is not None and (root / wilds["folder"] / wilds["csv"]).is_file():
            return load_wilds_folder(ref.name, root, split, limit)
        original = group_layouts()[ref.name].get("original")
        folder = original_folder(original, root) if original is not None else None
        if folder is not None:
            return load_original(ref.name, root, folder, split, limit)
        raise DatasetError(f"dataset {ref.name!r}: {root} holds neither {_where(ref.name)} for split {split!r}")

    def records(self) -> list[DatasetRecord]:
        return [DatasetRecord(name, self.task(DatasetRef(name)), (self.name,), (_where(name),))
                for name in group_layouts()]
