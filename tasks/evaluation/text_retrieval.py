"""Text retrieval on a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) with a text embedding model:
nDCG / MAP / recall / precision / MRR @k as beir's EvaluateRetrieval reports them (tasks/score/text_retrieval.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.beir import BeirData, open_beir
from clipcache.tasks.evaluation.base import (
    DataSource,
    Encoded,
    EncodeSession,
    EncodeSettings,
    EvalTask,
    Prepared,
    PromptSettings,
    Scored,
    ScoreSettings,
)
from clipcache.tasks.evaluation.common import RECOMPUTING_DOC, RECOMPUTING_QUERY
from clipcache.tasks.score.metrics import RANKING_METRICS

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.beir import BeirData
    from clipcache.tasks.progress import StageProgress

K_ALWAYS = 10  # beir's headline numbers are @10: always reported


class TextRetrieval(EvalTask["BeirData"]):
    name = "text_retrieval"
    short = "text retrieval"
    description = "BEIR folder + text model: ndcg, map, recall, precision, mrr @k (beir's EvaluateRetrieval)"
    needs = ("corpus", "query")
    reads = ("text",)
    main_metrics = (("ndcg", 10, "ndcg@10", 1),)
    metrics = RANKING_METRICS
    samples = (RECOMPUTING_QUERY, RECOMPUTING_DOC)

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[BeirData]:
        from clipcache.tasks.evaluation.common import dataset_root

        root = dataset_root(source, self.name, "a BEIR folder (corpus.jsonl, queries.jsonl, "
                            "qrels/<split>.tsv), e.g. outputs/<captioner>/<dataset>/retrieval_data")
        data = open_beir(source.name, root, source.split, source.limit)
        return Prepared(data, len(data.query_ids), source)

    def encode(self, session: EncodeSession, prepared: Prepared[BeirData], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
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

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[BeirData],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.score.retrieval_evidence import rank_text_queries, text_retrieval_evidence
        from clipcache.tasks.score.text_retrieval import per_query_metrics

        started = time.perf_counter()
        data: BeirData = prepared.data
        docs = store.open(encoded.outcomes["corpus"].ref.key).embeddings()
        queries = store.open(encoded.outcomes["query"].ref.key).embeddings()
        k_values = sorted(set(settings.recall_k) | {K_ALWAYS})
        ranked = rank_text_queries(queries, docs, data.relevant, data.gains)
        values = per_query_metrics(ranked.ranks, ranked.gains, k_values)
        metrics = {name: float(v.mean()) for name, v in values.items()}
        evidence = text_retrieval_evidence(ranked, values, k_values, query_index=np.arange(len(data.query_ids)),
                                           query_ids=data.query_ids, resamples=settings.bootstrap)
        return Scored(metrics, len(data.query_ids), seconds=time.perf_counter() - started, evidence=evidence)
