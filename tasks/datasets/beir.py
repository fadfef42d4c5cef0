"""Reading BEIR text-retrieval folders (what ``beir.datasets.data_loader.GenericDataLoader`` and MTEB 2.x custom
tasks read; tasks/convert/beir.py writes them)::

    corpus.jsonl       {"_id": "doc-1", "title": "", "text": "..."}
    queries.jsonl      {"_id": "query-1", "text": "..."}
    qrels/<split>.tsv  query-id<TAB>corpus-id<TAB>score, with that header line
    qrels.jsonl        {"query-id": ..., "corpus-id": ..., "score": 1}   (evalscope's MTEB 2.x custom tasks)

The any-to-any folder (tasks/datasets/any2any.py) is the same layout with images allowed; it shares the qrels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import DatasetError

if TYPE_CHECKING:  # naming datasets (is_beir_folder) must not import numpy
    import numpy as np

    from clipcache.storage.hashing import FileHashMemo


def is_beir_folder(root: Path) -> bool:
    return (root / "corpus.jsonl").is_file() and (root / "queries.jsonl").is_file()


def qrels_path(folder: Path, split: str) -> Path:
    """``qrels/<split>.tsv`` (BEIR), else ``qrels.jsonl`` (evalscope's MTEB 2.x custom tasks: one file for every
    split)."""
    tsv = Path(folder) / "qrels" / f"{split}.tsv"
    return Path(folder) / "qrels.jsonl" if not tsv.is_file() and (Path(folder) / "qrels.jsonl").is_file() else tsv


def read_beir(folder: Path, split: str) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, int]]]:
    """(corpus id -> text, query id -> text, qrels query id -> {doc id: score}); title and text are joined as BEIR
    does for dense retrieval ("title text")."""
    folder = Path(folder)
    paths = {"corpus": folder / "corpus.jsonl", "queries": folder / "queries.jsonl", "qrels": qrels_path(folder, split)}
    for what, path in paths.items():
        if not path.is_file():
            raise DatasetError(f"BEIR folder {folder}: {path.relative_to(folder)} is missing ({what}; or qrels.jsonl)")
    corpus: dict[str, str] = {}
    queries: dict[str, str] = {}
    for kind, target in (("corpus", corpus), ("queries", queries)):
        for n, line in enumerate(paths[kind].read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row["text"] if kind == "queries" else f"{row.get('title', '')} {row['text']}".strip()
                target[str(row["_id"])] = text
            except (ValueError, KeyError, TypeError) as e:
                raise DatasetError(f"{paths[kind]} line {n}: expected {{\"_id\", \"text\"}} ({e})") from e
    return corpus, queries, read_qrels(paths["qrels"])


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR's ``qrels/<split>.tsv`` (a header, then query-id, corpus-id, score) or evalscope's ``qrels.jsonl``."""
    if path.suffix == ".jsonl":
        return _jsonl_qrels(path)
    qrels: dict[str, dict[str, int]] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        if len(parts) != 3:
            raise DatasetError(f"{path} line {n}: expected query-id<TAB>corpus-id<TAB>score")
        try:
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
        except ValueError:
            raise DatasetError(f"{path} line {n}: the score {parts[2]!r} is not an integer") from None
    return qrels


def _jsonl_qrels(path: Path) -> dict[str, dict[str, int]]:
    """``{"query-id", "corpus-id", "score"}`` lines; the score is read as evalscope reads it (int, default 1)."""
    qrels: dict[str, dict[str, int]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            qrels.setdefault(str(row["query-id"]), {})[str(row["corpus-id"])] = int(row.get("score", 1))
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{path} line {n}: expected {{\"query-id\", \"corpus-id\", \"score\"}} ({e})") from e
    return qrels


@dataclass
class BeirData:
    name: str
    split: str
    root: Path
    doc_ids: list[str]
    doc_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    relevant: list[np.ndarray] = field(default_factory=list)  # per query: indices of docs with score > 0
    gains: list[np.ndarray] = field(default_factory=list)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        files = [self.root / "corpus.jsonl", self.root / "queries.jsonl", qrels_path(self.root, self.split)]
        return {"format": "beir", "content": memo.fingerprint(files, root=self.root)}


def open_beir(name: str, root: Path, split: str, limit: int | None) -> BeirData:
    """Queries with at least one relevant document in the corpus are evaluated (as pytrec_eval does); ``limit``
    keeps the first N of them. The whole corpus is always searched."""
    import numpy as np

    corpus, queries, qrels = read_beir(root, split)
    doc_ids = list(corpus)
    position = {d: i for i, d in enumerate(doc_ids)}
    data = BeirData(name, split, Path(root), doc_ids, [corpus[d] for d in doc_ids], [], [])
    for qid, text in queries.items():
        judged = {d: s for d, s in qrels.get(qid, {}).items() if s > 0 and d in position}
        if not judged:
            continue
        data.query_ids.append(qid)
        data.query_texts.append(text)
        data.relevant.append(np.array([position[d] for d in judged], dtype=np.int64))
        data.gains.append(np.array(list(judged.values()), dtype=np.float64))
        if limit is not None and len(data.query_ids) >= limit:
            break
    if not data.query_ids:
        raise DatasetError(f"BEIR folder {root}: no query of split {split!r} has a relevant document in the corpus")
    return data
