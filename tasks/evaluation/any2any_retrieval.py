"""Any-to-any retrieval over a user's corpus (MIEB's Any2AnyRetrieval family): queries and documents are images or
texts, embedded by the one image-text model, ranked by cosine similarity, scored with the text-retrieval metrics
(nDCG / MAP / recall / precision / MRR @k, as beir's EvaluateRetrieval reports them).

The folder is BEIR's layout with an ``image`` field allowed in place of ``text`` (read by
tasks/datasets/any2any.py), so image->image, text->image, image->text and text->text all live in one folder, mixed as
the user likes. Each side's images and texts are separate cache entries; a rescore with other k values reads only
the cache.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
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

if TYPE_CHECKING:  # numpy and the reader load when a run uses the task, not when options are read
    import numpy as np

    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.any2any import Any2AnyData, Side
    from clipcache.tasks.progress import StageProgress

K_ALWAYS = 10


class Any2AnyRetrieval(EvalTask["Any2AnyData"]):
    name = "any2any_retrieval"
    short = "any2any"
    description = "images and texts as queries and documents (MIEB Any2Any): ndcg, map, recall, precision, mrr @k"
    needs: ClassVar[tuple[str, ...]] = ("corpus_image", "corpus_text", "query_image", "query_text")  # never sharded: user-sized corpora
    reads = ("any2any",)
    main_metrics = (("ndcg", 10, "ndcg@10", 1),)
    metrics = RANKING_METRICS
    samples = (RECOMPUTING_QUERY, RECOMPUTING_DOC)

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[Any2AnyData]:
        from clipcache.tasks.evaluation.common import dataset_root

        root = dataset_root(source, self.name, "a folder with corpus.jsonl, queries.jsonl "
                            "(records with 'image' or 'text') and qrels/<split>.tsv")
        from clipcache.tasks.datasets.any2any import open_any2any

        data = open_any2any(source.name, root, source.split, source.limit)
        return Prepared(data, len(data.queries.ids), source)

    def encode(self, session: EncodeSession, prepared: Prepared[Any2AnyData], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.encode.stage import check_cached, encode_images, encode_texts

        started = time.perf_counter()
        data: Any2AnyData = prepared.data
        identity = data.identity(memo)
        base = {"model": session.resolved.identity, "precision": session.precision, "dataset": identity,
                "split": data.split, "limit": prepared.source.limit}
        wanted: dict[str, tuple[dict, Side]] = {}
        for side_name, side in (("corpus", data.corpus), ("query", data.queries)):
            if len(side.images):
                wanted[f"{side_name}_image"] = ({**base, "role": f"{side_name}_image",
                                                 "images": side.images.identity(memo)}, side)
            if side.texts:
                wanted[f"{side_name}_text"] = ({**base, "role": f"{side_name}_text"}, side)
        memo.save()
        if settings.cached_only:
            check_cached(store, [(fields, f"{role.replace('_', ' ')} embeddings of {data.name}")
                                 for role, (fields, _) in wanted.items()])
        outcomes = {}
        for role, (fields, side) in wanted.items():
            if role.endswith("_image"):
                outcomes[role] = encode_images(session, side.images, store, fields, settings, progress)
            else:
                outcomes[role] = encode_texts(session, side.texts, store, fields, kind=role.replace("_", " "),
                                              batch_size=settings.batch_size, progress=progress, label=data.name,
                                              meta={"dataset": data.name, "split": data.split})
        return Encoded(outcomes, seconds=time.perf_counter() - started)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[Any2AnyData],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.score.retrieval_evidence import rank_text_queries, text_retrieval_evidence
        from clipcache.tasks.score.text_retrieval import per_query_metrics

        started = time.perf_counter()
        data: Any2AnyData = prepared.data
        docs, doc_ok = _side_matrix(store, encoded, "corpus", data.corpus)
        queries, query_ok = _side_matrix(store, encoded, "query", data.queries)
        # documents whose image was skipped as undecodable leave the corpus; queries without a judged document left
        # in it are not scored (as pytrec_eval skips queries without relevant documents)
        new_position = np.cumsum(doc_ok) - 1
        relevant, gains, rows = [], [], []
        for q in np.flatnonzero(query_ok):
            keep = doc_ok[data.relevant[q]]
            if keep.any():
                relevant.append(new_position[data.relevant[q][keep]])
                gains.append(data.gains[q][keep])
                rows.append(q)
        if not rows:
            raise DatasetError(f"any-to-any folder {data.root}: no query is left with a relevant document")
        k_values = sorted(set(settings.recall_k) | {K_ALWAYS})
        ranked = rank_text_queries(queries[rows], docs[doc_ok], relevant, gains, doc_index=np.flatnonzero(doc_ok))
        values = per_query_metrics(ranked.ranks, ranked.gains, k_values)
        metrics = {name: float(v.mean()) for name, v in values.items()}
        evidence = text_retrieval_evidence(ranked, values, k_values, query_index=np.asarray(rows, dtype=np.int64),
                                           query_ids=[data.queries.ids[q] for q in rows],
                                           resamples=settings.bootstrap)
        skipped = int((~doc_ok).sum() + (~query_ok).sum())
        if skipped:
            metrics["skipped_images"] = float(skipped)
        return Scored(metrics, len(rows), seconds=time.perf_counter() - started, evidence=evidence)


def _side_matrix(store: EmbeddingStore, encoded: Encoded, side_name: str, side: Side) -> tuple[np.ndarray, np.ndarray]:
    """The side's embeddings in record order, and which records have one (an image skipped as undecodable has
    none)."""
    import numpy as np

    from clipcache.tasks.score.stage import _expect

    n = len(side.ids)
    ok = np.ones(n, dtype=bool)
    out: np.ndarray | None = None
    for kind, mask in (("image", side.is_image), ("text", ~side.is_image)):
        outcome = encoded.outcomes.get(f"{side_name}_{kind}")
        if outcome is None:
            continue
        entry = store.open(outcome.ref.key)
        vectors = entry.embeddings()
        if out is None:
            out = np.zeros((n, entry.dim), dtype=np.float32)
        _expect(entry.dim == out.shape[1], entry, f"its embeddings have {entry.dim} dimensions, the other "
                                                  f"side's {out.shape[1]}")
        records = np.flatnonzero(mask)
        if kind == "image":
            expected = len(side.images)
            _expect(int(entry.meta.get("n_samples", entry.count)) == expected, entry,
                    f"it holds rows of {entry.meta.get('n_samples', entry.count)} images, the folder has {expected}")
            row_of = np.full(expected, -1, dtype=np.int64)
            row_of[entry.array("position")] = np.arange(entry.count)
            rows = row_of[side.row[records]]
            ok[records[rows < 0]] = False
            out[records[rows >= 0]] = vectors[rows[rows >= 0]]
        else:
            _expect(entry.count == len(side.texts), entry,
                    f"it holds {entry.count} texts, the folder has {len(side.texts)}")
            out[records] = vectors[side.row[records]]
    assert out is not None
    return out, ok
