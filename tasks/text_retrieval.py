"""Text retrieval on a BEIR folder: encode corpus and queries through the embedding cache, score with exact ranks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.convert.beir import read_beir
from clipcache.tasks.encode.stage import EncodeOutcome, ModelSession, encode_texts
from clipcache.tasks.progress import StageProgress
from clipcache.tasks.score.text_retrieval import text_retrieval_metrics


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

    def identity(self, memo: FileHashMemo) -> dict:
        files = [self.root / "corpus.jsonl", self.root / "queries.jsonl", self.root / "qrels" / f"{self.split}.tsv"]
        return {"format": "beir", "content": memo.fingerprint(files, root=self.root)}


def open_beir(name: str, root: Path, split: str, limit: int | None) -> BeirData:
    """Queries with at least one relevant document in the corpus are evaluated (as pytrec_eval does); ``limit``
    keeps the first N of them. The whole corpus is always searched."""
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


@dataclass
class EncodedBeir:
    corpus: EncodeOutcome
    queries: EncodeOutcome
    seconds: float

    @property
    def cache_hit(self) -> bool:
        return self.corpus.cache_hit and self.queries.cache_hit

    @property
    def cache_keys(self) -> list[str]:
        return [self.corpus.ref.key, self.queries.ref.key]


def encode_beir(session: ModelSession, data: BeirData, store: EmbeddingStore, memo: FileHashMemo, batch_size: int,
                limit: int | None, progress: StageProgress) -> EncodedBeir:
    started = time.perf_counter()
    identity = data.identity(memo)
    memo.save()
    base = {"model": session.resolved.identity, "precision": session.precision, "dataset": identity,
            "split": data.split}
    # Documents and queries are different roles: a text that is both never shares one cache entry.
    corpus = encode_texts(session, data.doc_texts, store, {**base, "role": "corpus", "limit": None}, "document",
                          batch_size, progress, data.name, meta={"dataset": data.name, "split": data.split})
    queries = encode_texts(session, data.query_texts, store, {**base, "role": "query", "limit": limit}, "query",
                           batch_size, progress, data.name, meta={"dataset": data.name, "split": data.split})
    return EncodedBeir(corpus, queries, time.perf_counter() - started)


def score_beir(store: EmbeddingStore, encoded: EncodedBeir, data: BeirData, k_values: list[int]) -> dict[str, float]:
    docs = store.open(encoded.corpus.ref.key).embeddings()
    queries = store.open(encoded.queries.ref.key).embeddings()
    return text_retrieval_metrics(queries, docs, data.relevant, data.gains, k_values)
