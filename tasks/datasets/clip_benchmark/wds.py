"""The hosted webdataset layout used by LAION clip_benchmark and evalscope for the 43 benchmark datasets.

::

    <root>/classnames.txt                          one class name per line (classification)
    <root>/zeroshot_classification_templates.txt   one template per line, placeholder {c}
    <root>/dataset_type.txt                        optional: retrieval | multilabel (default: classification)
    <root>/<split>/nshards.txt                     number of shards N
    <root>/<split>/{0..N-1}.tar                    members <key>.webp|png|jpg|jpeg + <key>.cls | <key>.txt | <key>.npy

Shards are indexed with ``tarfile`` (member offsets) instead of streamed, so samples keep shard order with any number
of workers (clip_benchmark's streaming loader fails when workers > shards) and can be read by position.
"""

from __future__ import annotations

import io
import os
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset, Task, template_problem

IMAGE_EXTENSIONS = ("webp", "png", "jpg", "jpeg")
_OPEN_LOCK = threading.Lock()


def split_key(member_name: str) -> tuple[str, str]:
    """webdataset's rule: the key is the path up to the first dot of the file name, the rest is the extension."""
    directory, _, base = member_name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{directory}/{stem}" if directory else stem
    return key, ext.lower() if dot else ""


def read_lines(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines()]
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start + 1}); save the file as UTF-8") from e


@dataclass
class _Member:
    shard: int
    name: str
    offset: int
    size: int


@dataclass
class WebDataset(EvalDataset):
    root: Path = Path(".")
    shards: list[Path] = field(default_factory=list)
    members: list[_Member] = field(default_factory=list)
    _handles: dict[int, int] = field(default_factory=dict, repr=False)  # shard -> OS file descriptor

    def __len__(self) -> int:
        return len(self.members)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        # The shards read, and dataset_type.txt (it decides how labels are parsed). Class names and templates are
        # left out on purpose: they change prompts, which are cached by their own text, never image vectors.
        meta = [p for p in [self.root / "dataset_type.txt"] if p.exists()]
        return {"format": "wds", "content": memo.fingerprint(meta + self.shards_used(), root=self.root)}

    def shards_used(self) -> list[Path]:
        last = self.members[-1].shard if self.members else -1
        return self.shards[: last + 1]

    def describe(self, index: int) -> str:
        m = self.members[index]
        return f"{self.shards[m.shard]} member {m.name}"

    def sample_key(self, index: int) -> str:
        m = self.members[index]
        return f"{self.shards[m.shard].name}/{split_key(m.name)[0]}"

    def read_image_bytes(self, index: int) -> bytes:
        # os.pread reads at an offset without moving a shared file position: safe from several decode threads.
        m = self.members[index]
        fd = self._handles.get(m.shard)
        if fd is None:
            with _OPEN_LOCK:
                fd = self._handles.get(m.shard)
                if fd is None:
                    fd = self._handles[m.shard] = os.open(self.shards[m.shard], os.O_RDONLY)
        data = os.pread(fd, m.size, m.offset)
        if len(data) != m.size:
            raise DatasetError(f"{self.describe(index)}: shard ends before the member does (truncated file?)")
        return data

    def __getstate__(self) -> dict[str, Any]:
        # a decoding worker process opens the shards itself: descriptors are numbers valid only in this process
        return {**self.__dict__, "_handles": {}}

    def close(self) -> None:
        for fd in self._handles.values():
            os.close(fd)
        self._handles.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except (AttributeError, TypeError, OSError):  # at interpreter exit `os` may be gone; the OS closes them
            pass


def _dataset_type(root: Path) -> str:
    path = root / "dataset_type.txt"
    if not path.exists():
        return "classification"
    value = path.read_text(encoding="utf-8").strip().lower()
    if value not in ("classification", "retrieval", "multilabel"):
        raise DatasetError(f"{path}: unknown dataset type {value!r} (expected retrieval, multilabel or classification)")
    return value


def available_splits(root: Path) -> list[str]:
    return sorted(p.parent.name for p in root.glob("*/nshards.txt"))


def load_webdataset(name: str, root: Path, split: str, limit: int | None) -> WebDataset:
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"dataset {name!r}: directory {root} does not exist")
    nshards_path = root / split / "nshards.txt"
    if not nshards_path.exists():
        splits = available_splits(root)
        hint = f"available splits: {', '.join(splits)}" if splits else "no split directory with nshards.txt found"
        raise DatasetError(f"dataset {name!r}: {nshards_path} is missing ({hint})")
    try:
        nshards = int(nshards_path.read_text().strip())
    except ValueError as e:
        raise DatasetError(f"{nshards_path}: expected an integer number of shards") from e
    kind = _dataset_type(root)
    shards = [root / split / f"{i}.tar" for i in range(nshards)]
    task: Task = "zeroshot_retrieval" if kind == "retrieval" else "zeroshot_classification"
    ds = WebDataset(name=name, split=split, task=task, multilabel=kind == "multilabel", root=root, shards=shards)
    labels: list[Any] = []
    captions: list[list[str]] = []
    label_ext = {"retrieval": "txt", "multilabel": "npy"}.get(kind, "cls")
    for shard_id, shard in enumerate(shards):
        if limit is not None and len(ds.members) >= limit:
            break
        if not shard.exists():
            raise DatasetError(f"dataset {name!r}: shard {shard} is missing ({nshards_path} says {nshards} shards)")
        index_shard(ds, shard_id, shard, label_ext, labels=labels, captions=captions, limit=limit)
    if not ds.members:
        raise DatasetError(f"dataset {name!r}: {root / split} has no samples")
    if kind == "retrieval":
        ds.captions = captions
    else:
        ds.labels = np.stack(labels).astype(np.uint8) if kind == "multilabel" else np.asarray(labels, dtype=np.int64)
        ds.prompts = read_prompts(root, name)
        _check_labels(ds, name)
    return ds


def index_shard(ds: WebDataset, shard_id: int, shard: Path, label_ext: str, *, labels: list, captions: list,
                 limit: int | None) -> None:
    """Index one shard into ``ds.members`` (its image members, in tar order, up to ``limit`` samples in all) and
    append each sample's ``<key>.<label_ext>`` member, parsed, to ``labels`` (``cls``: an int; any other extension:
    a numeric ``.npy`` array via :func:`read_npy`) or to ``captions`` (``txt``: one caption per line)."""
    samples: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    try:
        with tarfile.open(shard, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                key, ext = split_key(info.name)
                if key not in samples:
                    if limit is not None and len(ds.members) + len(order) >= limit:
                        break
                    samples[key] = {}
                    order.append(key)
                if ext in IMAGE_EXTENSIONS:
                    samples[key]["image"] = _Member(shard_id, info.name, info.offset_data, info.size)
                elif ext == label_ext:
                    member = tar.extractfile(info)
                    samples[key]["label"] = member.read() if member is not None else b""
    except (tarfile.TarError, OSError) as e:
        raise DatasetError(f"shard {shard} is not a readable tar file: {e}") from e
    for key in order:
        sample = samples[key]
        missing = [what for what in ("image", "label") if what not in sample]
        if missing:
            wanted = f".{label_ext} member" if "label" in missing else "image member (.webp/.png/.jpg/.jpeg)"
            raise DatasetError(f"shard {shard}: sample {key!r} has no {wanted}")
        ds.members.append(sample["image"])
        raw = sample["label"]
        where = f"{shard} member {key}.{label_ext}"
        if label_ext == "txt":
            captions.append(raw.decode("utf-8").splitlines())  # as clip_benchmark: one caption per line
        elif label_ext == "cls":
            try:
                labels.append(int(raw.decode("utf-8").strip()))
            except ValueError as e:
                raise DatasetError(f"{where}: class label is not an integer") from e
        else:
            labels.append(read_npy(raw, where).reshape(-1))


def read_npy(raw: bytes, where: str) -> np.ndarray:
    """A .npy member as a numeric array. An object array's data is a pickle, which would run code: it is refused
    (``allow_pickle=False``, checked in the header first to say so), and so is a .npz archive (np.load would open
    one; a label member is one array)."""
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        _, _, dtype = header(stream)
        if dtype.hasobject:
            raise DatasetError(f"{where}: refused to load an object array from a .npy file (its data is a pickle; "
                               f"clipcache loads only numeric arrays from dataset files)")
        stream.seek(0)
        return np.lib.format.read_array(stream, allow_pickle=False)
    except ValueError as e:
        raise DatasetError(f"{where}: not a .npy multi-hot vector ({e})") from e


def read_prompts(root: Path, name: str) -> ClassPrompts:
    """``root``'s classnames.txt and zeroshot_classification_templates.txt (each template with ``{c}``); a missing
    file, an empty one or a bad template is a DatasetError naming the file."""
    classnames_path = root / "classnames.txt"
    templates_path = root / "zeroshot_classification_templates.txt"
    for path in (classnames_path, templates_path):
        if not path.exists():
            raise DatasetError(f"dataset {name!r}: {path} is missing (needed for zero-shot classification)")
    templates = [t for t in read_lines(templates_path) if t]
    for template in templates:
        if (problem := template_problem(template)) is not None:
            raise DatasetError(f"{templates_path}: the template {template!r} {problem}")
    bad = [t for t in templates if "{c}" not in t]
    if bad:
        raise DatasetError(f"{templates_path}: template {bad[0]!r} has no {{c}} placeholder")
    classnames = read_lines(classnames_path)
    if not any(classnames):
        raise DatasetError(f"{classnames_path}: no class names (one per line)")
    if not templates:
        raise DatasetError(f"{templates_path}: no templates (one per line, each with {{c}})")
    return ClassPrompts(classnames, templates, "en", os.fspath(root))


def _check_labels(ds: WebDataset, name: str) -> None:
    if ds.prompts is None or ds.labels is None:
        return
    labels, n_classes = ds.labels, len(ds.prompts.classnames)
    if ds.multilabel:
        if len(labels) and labels.shape[1] != n_classes:
            raise DatasetError(f"dataset {name!r}: multi-hot labels have {labels.shape[1]} classes, "
                               f"classnames.txt has {n_classes}")
        return
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    if len(bad):
        raise DatasetError(f"dataset {name!r}: {ds.describe(int(bad[0]))} has label {int(labels[bad[0]])}, "
                           f"outside the {n_classes} classes of classnames.txt")
