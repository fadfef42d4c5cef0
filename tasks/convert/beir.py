"""BEIR text-retrieval files from captioned images, and reading BEIR folders back.

Layout (what ``beir.datasets.data_loader.GenericDataLoader`` and MTEB 2.x custom tasks read)::

    corpus.jsonl       {"_id": "doc-<i>", "title": "", "text": <caption of image i>}
    queries.jsonl      {"_id": "query-<j>", "text": <original caption / query j>}
    qrels/<split>.tsv  query-id<TAB>corpus-id<TAB>score, with that header line
    qrels.jsonl        {"query-id": ..., "corpus-id": ..., "score": 1}   (MTEB 2.x)

Query and document ids live in different namespaces (``query-`` / ``doc-`` prefixes): BEIR and MTEB silently drop a
hit whose query id equals its document id, which evalscope's shared 0..n numbering triggers for every true pair.
Images whose captioning failed are left out with their queries (listed in the conversion result instead).
The folder is written next to its final place and renamed over it, so it is never seen half-written.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipcache.storage.atomic import staging_dir
from clipcache.storage.errors import DatasetError


@dataclass
class BeirCounts:
    corpus: int
    queries: int
    qrels: int


def _jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_beir(folder: Path, captions: list[str | None], queries: list[list[str]], split: str) -> BeirCounts:
    corpus: list[dict[str, str]] = []
    query_rows: list[dict[str, str]] = []
    qrels: list[dict[str, Any]] = []
    for i, (caption, image_queries) in enumerate(zip(captions, queries, strict=True)):
        if caption is None:
            continue
        doc_id = f"doc-{i}"
        corpus.append({"_id": doc_id, "title": "", "text": caption})
        for text in image_queries:
            query_id = f"query-{len(query_rows)}"
            query_rows.append({"_id": query_id, "text": text})
            qrels.append({"query-id": query_id, "corpus-id": doc_id, "score": 1})
    staging = staging_dir(folder)
    try:
        _jsonl(staging / "corpus.jsonl", corpus)
        _jsonl(staging / "queries.jsonl", query_rows)
        _jsonl(staging / "qrels.jsonl", qrels)
        (staging / "qrels").mkdir()
        with open(staging / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            f.writelines(f"{q['query-id']}\t{q['corpus-id']}\t{q['score']}\n" for q in qrels)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BeirCounts(len(corpus), len(query_rows), len(qrels))


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
