"""``csv_captions``: image-text retrieval data as ``<root>/<split>.csv``.

The file has a header with (at least) the columns ``image`` and ``caption`` and one row per caption; an image with
several captions has several rows. Images are numbered in the order they first appear; ``image`` paths are relative
to the CSV's folder (or absolute). ``--limit N`` keeps exactly the first N images, with all their captions.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.datasets.reader import DatasetReader

COLUMNS = ("image", "caption")


@dataclass
class CsvCaptionsDataset(EvalDataset):
    csv_path: Path = Path(".")
    image_paths: list[Path] = field(default_factory=list)
    first_lines: list[int] = field(default_factory=list)  # the CSV line that introduced each image, for messages

    def __len__(self) -> int:
        return len(self.image_paths)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        # The CSV (captions and their order) and every image's bytes: editing either makes a new cache entry.
        return {"format": "csv_captions", "index": memo.sha256(self.csv_path),
                "images": memo.fingerprint(self.image_paths, root=self.csv_path.parent)}

    def describe(self, index: int) -> str:
        return f"{self.image_paths[index]} ({self.csv_path} line {self.first_lines[index]})"

    def read_image_bytes(self, index: int) -> bytes:
        return self.image_paths[index].read_bytes()


class CsvCaptions(DatasetReader):
    task = "zeroshot_retrieval"
    description = "example plugin: <root>/<split>.csv with columns image,caption (one row per caption)"

    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> CsvCaptionsDataset:
        if root is None:
            raise DatasetError(f"dataset {name!r} needs --dataset_root: the folder holding {split}.csv")
        path = Path(root) / f"{split}.csv"
        if not path.is_file():
            raise DatasetError(f"dataset {name!r}: {path} not found (expected <root>/<split>.csv with columns "
                               f"{','.join(COLUMNS)})")
        ds = CsvCaptionsDataset(name=name, split=split, task=self.task, csv_path=path, captions=[])
        position: dict[str, int] = {}
        with open(path, encoding="utf-8", newline="") as f:
            rows = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (rows.fieldnames or [])]
            if missing:
                raise DatasetError(f"{path}: the header has no column {', '.join(missing)} (expected "
                                   f"{','.join(COLUMNS)})")
            for row in rows:
                line, image, caption = rows.line_num, (row["image"] or "").strip(), (row["caption"] or "").strip()
                if not image or not caption:
                    raise DatasetError(f"{path} line {line}: empty image or caption")
                if image not in position:
                    if limit is not None and len(position) >= limit:
                        continue  # past the limit: later rows may still add captions to kept images
                    file = Path(image).expanduser()
                    file = file if file.is_absolute() else path.parent / file
                    if not file.is_file():
                        raise DatasetError(f"{path} line {line}: image {image!r} not found ({file})")
                    position[image] = len(ds.image_paths)
                    ds.image_paths.append(file)
                    ds.first_lines.append(line)
                    ds.captions.append([])
                ds.captions[position[image]].append(caption)
        if not ds.image_paths:
            raise DatasetError(f"dataset {name!r}: {path} has no rows")
        return ds
