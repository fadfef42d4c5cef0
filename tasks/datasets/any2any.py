"""Reading any-to-any retrieval folders (MIEB's Any2AnyRetrieval family; the task is
tasks/evaluation/any2any_retrieval.py). The folder is BEIR's layout with an ``image`` field allowed in place of
``text``::

    <root>/corpus.jsonl    {"_id": "d1", "image": "images/cat.jpg"}   or   {"_id": "d2", "text": "a cat"}
    <root>/queries.jsonl   {"_id": "q1", "text": "a photo of a cat"}  or   {"_id": "q2", "image": "queries/x.png"}
    <root>/qrels/<split>.tsv   query-id <TAB> corpus-id <TAB> score   (or qrels.jsonl)

Image paths are relative to the folder (or absolute). So image->image, text->image, image->text and text->text all
live in one folder, mixed as the user likes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import EvalDataset, iter_jsonl_records, resolve_image_path
from clipcache.tasks.datasets.beir import qrels_path, read_qrels


@dataclass
class SideImages(EvalDataset):
    """The images of one side (corpus or queries) as a dataset the image encoder walks."""

    paths: list[Path] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    root: Path = Path(".")

    def __len__(self) -> int:
        return len(self.paths)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {"format": "any2any-images", "images": memo.fingerprint(self.paths, root=self.root)}

    def describe(self, index: int) -> str:
        return f"{self.paths[index]} ({self.where[index]})"

    def read_image_bytes(self, index: int) -> bytes:
        return self.paths[index].read_bytes()


@dataclass
class Side:
    """One side's records in file order: each is an image (row in ``images``) or a text (row in ``texts``)."""

    ids: list[str]
    is_image: np.ndarray  # bool per record
    row: np.ndarray  # per record: its row among the side's images or among its texts
    images: SideImages
    texts: list[str]


@dataclass
class Any2AnyData:
    name: str
    split: str
    root: Path
    corpus: Side
    queries: Side
    relevant: list[np.ndarray]  # per query: corpus positions with score > 0
    gains: list[np.ndarray]
    files: list[Path]

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {"format": "any2any", "content": memo.fingerprint(self.files, root=self.root)}


def _read_side(path: Path, name: str, split: str, side: str, keep: set[str] | None = None,
               limit: int | None = None) -> Side:
    if not path.is_file():
        raise DatasetError(f"any-to-any folder {path.parent}: {path.name} is missing")
    images = SideImages(name=f"{name}:{side}", split=split, task="zeroshot_retrieval", root=path.parent)
    ids: list[str] = []
    texts: list[str] = []
    is_image: list[bool] = []
    rows: list[int] = []
    seen: set[str] = set()
    for line_no, record in iter_jsonl_records(path, ("_id",)):
        where = f"{path} line {line_no}"
        rid = str(record["_id"])
        if rid in seen:
            raise DatasetError(f"{where}: _id {rid!r} appears twice")
        seen.add(rid)
        if keep is not None and rid not in keep:
            continue
        if limit is not None and len(ids) >= limit:
            break
        has_image, has_text = "image" in record, "text" in record
        if has_image == has_text:
            raise DatasetError(f"{where}: give exactly one of 'image' (a path) and 'text' "
                               f"({'both' if has_image else 'neither'} given)")
        if has_image:
            image = resolve_image_path(str(record["image"]), path.parent)
            if image is None:
                raise DatasetError(f"{where}: image {record['image']!r} not found (paths are relative to "
                                   f"{path.parent})")
            rows.append(len(images.paths))
            images.paths.append(image)
            images.where.append(where)
        else:
            if not isinstance(record["text"], str):
                raise DatasetError(f"{where}: 'text' must be a string")
            rows.append(len(texts))
            texts.append(record["text"])
        ids.append(rid)
        is_image.append(has_image)
    return Side(ids, np.asarray(is_image, dtype=bool), np.asarray(rows, dtype=np.int64), images, texts)


def open_any2any(name: str, root: Path, split: str, limit: int | None) -> Any2AnyData:
    """Queries with at least one relevant document are evaluated (as pytrec_eval does); ``limit`` keeps the first N
    of them. The whole corpus is always searched."""
    root = Path(root)
    qrels_file = qrels_path(root, split)
    if not qrels_file.is_file():
        raise DatasetError(f"any-to-any folder {root}: qrels/{split}.tsv (or qrels.jsonl) is missing")
    qrels = read_qrels(qrels_file)
    corpus = _read_side(root / "corpus.jsonl", name, split, "corpus")
    position = {d: i for i, d in enumerate(corpus.ids)}
    judged = {q: {d: s for d, s in docs.items() if s > 0 and d in position} for q, docs in qrels.items()}
    wanted = {q for q, docs in judged.items() if docs}
    queries = _read_side(root / "queries.jsonl", name, split, "queries", keep=wanted, limit=limit)
    if not queries.ids:
        raise DatasetError(f"any-to-any folder {root}: no query of split {split!r} has a relevant document in the "
                           f"corpus")
    relevant = [np.array([position[d] for d in judged[q]], dtype=np.int64) for q in queries.ids]
    gains = [np.array(list(judged[q].values()), dtype=np.float64) for q in queries.ids]
    files = [root / "corpus.jsonl", root / "queries.jsonl", qrels_file]
    return Any2AnyData(name, split, root, corpus, queries, relevant, gains, files)
