"""clip_benchmark's torchvision-backed classification sets, read through torchvision's own dataset classes.

clip_benchmark builds mnist, stl10, food101, sun397, cars, fgvc_aircraft, dtd, pets, flowers, eurosat, gtsrb,
country211, pcam and renderedsst2 with ``torchvision.datasets.<Class>(root, split, download=...)``; clipcache builds
the same class on the same folder with ``download=False``, so the samples, their order and their labels are
torchvision's by construction. What clipcache adds: the labels are read without decoding an image, each image file
is content-hashed for the cache key, a missing folder is named with where the files come from, and the class names
are those clip_benchmark uses (tasks/datasets/clip_benchmark/layouts.json says which, per dataset).
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.datasets.base import EvalDataset, relative_name


@dataclass
class TorchvisionImages(EvalDataset):
    """A torchvision dataset (built without transforms) indexed for the encode stage."""

    source: Any = None
    paths: list[Path] | None = None  # the image files, when the dataset reads one file per image
    folder: Path = Path(".")
    layout: str = ""

    def __len__(self) -> int:
        return 0 if self.labels is None else len(self.labels)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        # One file per image: those files. Images packed in a few files (MNIST, STL10, PCAM): every file under the
        # dataset's folder. The labels' digest covers the annotation files either way.
        files = self.paths if self.paths is not None else sorted(p for p in self.folder.rglob("*") if p.is_file())
        return {"format": self.layout, "files": memo.fingerprint(files, root=self.folder),
                "labels": digest(np.asarray(self.labels).tolist())}

    def describe(self, index: int) -> str:
        if self.paths is not None:
            return str(self.paths[index])
        return f"{self.folder} ({self.split} split) image {index}"

    def sample_key(self, index: int) -> str | None:
        return None if self.paths is None else relative_name(self.paths[index], self.folder)

    def read_image_bytes(self, index: int) -> bytes | Image.Image:
        if self.paths is not None:
            return self.paths[index].read_bytes()
        try:
            return self.source[index][0]
        except Exception as e:  # the packed formats raise their own types for damaged data
            raise DatasetError(f"image does not decode: {self.describe(index)} ({type(e).__name__}: {e})") from e


def image_files(ds: Any) -> list[Path] | None:
    """The image file of each sample, in sample order, where the torchvision class keeps them."""
    for attr in ("_image_files", "_images"):
        if (files := getattr(ds, attr, None)) is not None:
            return [Path(f) for f in files]
    for attr in ("_samples", "samples"):
        if (samples := getattr(ds, attr, None)) is not None:
            return [Path(s[0]) for s in samples]
    return None


def targets(ds: Any) -> np.ndarray:
    """Each sample's class index, read from the class's index rather than by decoding every sample."""
    for attr in ("targets", "_labels", "labels"):
        if (values := getattr(ds, attr, None)) is not None:
            return np.asarray(values, dtype=np.int64).reshape(-1)
    for attr in ("_samples", "samples"):
        if (samples := getattr(ds, attr, None)) is not None:
            return np.asarray([s[1] for s in samples], dtype=np.int64)
    if type(ds).__name__ == "PCAM":  # labels live in their own .h5 file
        import h5py

        with h5py.File(ds._base_folder / ds._FILES[ds._split]["targets"][0]) as f:
            return np.asarray(f["y"][:, 0, 0, 0], dtype=np.int64)
    return np.asarray([ds[i][1] for i in range(len(ds))], dtype=np.int64)


def build(name: str, entry: dict[str, Any], root: Path, split: str) -> Any:
    """``torchvision.datasets.<class>`` on ``root`` as clip_benchmark calls it, without downloading."""
    import torchvision.datasets

    cls = getattr(torchvision.datasets, entry["class"])
    kwargs = dict(entry.get("kwargs", {}))
    if entry["split_arg"] == "train":
        kwargs["train"] = split == "train"
    elif entry["split_arg"] == "split":
        kwargs["split"] = split
    folder = root / entry["folder"].format(split=split)
    try:
        return cls(root=str(root), download=False, **kwargs)
    except ImportError as e:
        raise DatasetError(f"dataset {name!r} needs the {e.name} package to read {folder} "
                           f"(pip install {e.name})") from e
    except pickle.UnpicklingError as e:
        # MNIST reads an old processed/*.pt if one is there, with torch.load(weights_only=True): a pickle that asks
        # for anything but tensors is refused by torch (its page-long message suggests weights_only=False: not ours)
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        what = repr(found.group(1)) if found else "an object other than tensors"
        raise DatasetError(f"dataset {name!r}: torchvision's {entry['class']} refused to load {what} from a pickle "
                           f"under {root / entry['folder'].split('/')[0]} (torch.load(weights_only=True) loads only "
                           f"tensors and plain containers; remove the file)") from e
    except (RuntimeError, OSError, KeyError, ValueError, IndexError) as e:
        if not folder.exists():
            raise DatasetError(f"dataset {name!r}: {folder} not found; clip_benchmark reads it with torchvision's "
                               f"{entry['class']} (files: {entry['source']})") from e
        raise DatasetError(f"dataset {name!r}: torchvision's {entry['class']} cannot read {folder} "
                           f"({type(e).__name__}: {e}; files: {entry['source']})") from e


def load_torchvision(name: str, entry: dict[str, Any], root: Path, split: str, limit: int | None,
                     classnames: Any) -> TorchvisionImages:
    """``classnames(torchvision_classes)`` gives the English class names clip_benchmark uses for this dataset."""
    ds = build(name, entry, root, split)
    labels = targets(ds)
    paths = image_files(ds)
    if len(labels) == 0:
        raise DatasetError(f"dataset {name!r}: no images in {root / entry['folder'].format(split=split)} "
                           f"({split} split)")
    prompts = classnames(list(getattr(ds, "classes", None) or []))
    bad = np.flatnonzero((labels < 0) | (labels >= len(prompts.classnames)))
    if len(bad):
        where = paths[bad[0]] if paths is not None else f"image {int(bad[0])}"
        raise DatasetError(f"dataset {name!r}: {where} has label {int(labels[bad[0]])}, outside the "
                           f"{len(prompts.classnames)} classes clip_benchmark names for it")
    return TorchvisionImages(name=name, split=split, task="zeroshot_classification", labels=labels[:limit],
                             prompts=prompts, source=ds, paths=None if paths is None else paths[:limit],
                             folder=root / entry["folder"].format(split=split).split("/")[0],
                             layout=f"torchvision-{entry['class']}")
