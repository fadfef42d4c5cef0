"""BEIR text-retrieval files from captioned images (reading them back: tasks/datasets/beir.py).

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
