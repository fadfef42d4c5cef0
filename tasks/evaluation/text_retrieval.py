"""Text retrieval on a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) with a text embedding model:
nDCG / MAP / recall / precision / MRR @k as beir's EvaluateRetrieval reports them (tasks/score/text_retrieval.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.evaluation.base import (
    DataSource,
    Encoded,
    EncodeSettings,
    EvalTask,
    Prepared,
    PromptSettings,
    Scored,
    ScoreSettings,
)

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.progress import StageProgress

K_ALWAYS = 10  # beir's headline numbers are @10: always reported


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
        from clipcache.tasks.convert.beir import qrels_path

        files = [self.root / "corpus.jsonl", self.root / "queries.jsonl", qrels_path(self.root, self.split)]
        return {"format": "beir", "content": memo.fingerprint(files, root=self.root)}


def open_beir(name: str, root: Path, split: str, limit: int | None) -> BeirData:
    """Queries with at least one relevant document in the corpus are evaluated (as pytrec_eval does); ``limit``
    keeps the first N of them. The whole corpus is always searched."""
    from clipcache.tasks.convert.beir import read_beir

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


def is_beir_folder(root: Path) -> bool:
    return (root / "corpus.jsonl").is_file() and (root / "queries.jsonl").is_file()


class TextRetrieval(EvalTask):
    name = "text_retrieval"
    short = "text retrieval"
    description = "BEIR folder + text model: ndcg, map, recall, precision, mrr @k (beir's EvaluateRetrieval)"
    needs = ("corpus", "query")
    reads = ("text",)
    main_metrics = (("ndcg", 10, "ndcg@10", 1),)

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared:
        from clipcache.tasks.datasets import format_root

        if not source.root:
            raise DatasetError("text_retrieval needs --dataset_root: a BEIR folder (corpus.jsonl, queries.jsonl, "
                               "qrels/<split>.tsv), e.g. outputs/<captioner>/<dataset>/retrieval_data")
        data = open_beir(source.name, format_root(source.root, source.name), source.split, source.limit)
        return Prepared(data, len(data.query_ids), source)

    def encode(self, session: Any, prepared: Prepared, store: EmbeddingStore, memo: FileHashMemo,
               settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.encode.stage import check_cached, encode_texts

        started = time.perf_counter()
        data: BeirData = prepared.data
        identity = data.identity(memo)
        memo.save()
        base = {"model": session.resolved.identity, "precision": session.precision, "dataset": identity,
                "split": data.split}
        # Documents and queries are different roles: a text that is both never shares one cache entry.
        corpus_fields = {**base, "role": "corpus", "limit": None}
        query_fields = {**base, "role": "query", "limit": prepared.source.limit}
        if settings.cached_only:
            check_cached(store, [(corpus_fields, f"corpus embeddings of {data.name}"),
                                 (query_fields, f"query embeddings of {data.name}")])
        meta = {"dataset": data.name, "split": data.split}
        corpus = encode_texts(session, data.doc_texts, store, corpus_fields, kind="document",
                              batch_size=settings.batch_size, progress=progress, label=data.name, meta=meta)
        queries = encode_texts(session, data.query_texts, store, query_fields, kind="query",
                               batch_size=settings.batch_size, progress=progress, label=data.name, meta=meta)
        return Encoded({"corpus": corpus, "query": queries}, seconds=time.perf_counter() - started)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared, settings: ScoreSettings) -> Scored:
        from clipcache.tasks.score.text_retrieval import text_retrieval_metrics

        started = time.perf_counter()
        data: BeirData = prepared.data
        docs = store.open(encoded.outcomes["corpus"].ref.key).embeddings()
        queries = store.open(encoded.outcomes["query"].ref.key).embeddings()
        k_values = sorted(set(settings.recall_k) | {K_ALWAYS})
        metrics = text_retrieval_metrics(queries, docs, data.relevant, data.gains, k_values)
        return Scored(metrics, len(data.query_ids), seconds=time.perf_counter() - started)
