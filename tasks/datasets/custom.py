"""evalscope's custom image-text retrieval layout: ``<data_dir>/image_queries.jsonl``.

Each line: ``{"image_path": "...", "query": ["caption", ...]}``. A relative ``image_path`` is looked up next to the
JSONL file first, then in the working directory (evalscope's own examples use working-directory paths).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import EvalDataset, iter_jsonl_records, resolve_image_path

FILENAME = "image_queries.jsonl"


@dataclass
class ImageQueriesDataset(EvalDataset):
    jsonl: Path = Path(FILENAME)
    image_paths: list[Path] = field(default_factory=list)
    line_numbers: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.image_paths)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {
            "format": "image_queries.jsonl",
            "index": memo.sha256(self.jsonl),
            "images": memo.fingerprint(self.image_paths, root=self.jsonl.parent),
        }

    def describe(self, index: int) -> str:
        return f"{self.image_paths[index]} ({self.jsonl} line {self.line_numbers[index]})"

    def read_image_bytes(self, index: int) -> bytes:
        return self.image_paths[index].read_bytes()


def load_image_queries(name: str, data_dir: Path, split: str, limit: int | None) -> ImageQueriesDataset:
    data_dir = Path(data_dir)
    jsonl = data_dir / FILENAME if data_dir.is_dir() or data_dir.suffix != ".jsonl" else data_dir
    if not jsonl.is_file():
        raise DatasetError(f"dataset {name!r}: {jsonl} not found (a custom dataset needs data_dir/{FILENAME})")
    captions: list[list[str]] = []
    ds = ImageQueriesDataset(name=name, split=split, task="zeroshot_retrieval", jsonl=jsonl, captions=captions)
    for line_no, record in iter_jsonl_records(jsonl, ("image_path", "query")):
        if limit is not None and len(ds.image_paths) >= limit:
            break
        where = f"{jsonl} line {line_no}"
        queries = record["query"]
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise DatasetError(f"{where}: 'query' must be a string or a list of strings")
        image = resolve_image_path(str(record["image_path"]), jsonl.parent)
        if image is None:
            raise DatasetError(f"{where}: image_path {record['image_path']!r} not found "
                               f"(looked next to {jsonl.name} and in {Path.cwd()})")
        ds.image_paths.append(image)
        ds.line_numbers.append(line_no)
        captions.append(queries)
    if not ds.image_paths:
        raise DatasetError(f"dataset {name!r}: {jsonl} has no samples")
    return ds
