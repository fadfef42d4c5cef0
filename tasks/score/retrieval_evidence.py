"""Evidence of the retrieval tasks: one row per query (and, for BEIR-style qrels, per judged relevant document), from
which every stored metric is recomputed exactly, and each metric's 95% bootstrap interval over the queries.

Zero-shot retrieval (units ``text_query``: one per caption, text -> image; ``image_query``: one per image,
image -> text). Per row:

- ``sample_index``: the caption's position in the dataset's caption order / the image's position in the dataset;
- ``target``: the positive ranked first (text query: its image; image query: the best-ranked of its captions), in
  the same numbering (images by dataset position, captions by caption position); null for an image without
  captions;
- ``rank``: 1 + its rank under ranking.py's stable rule (what mrr, ndcg and mean/median rank use); ``score``: its
  score on clip_benchmark's matrix (within ~1e-7 where the pass's own product gave it);
- ``top``: the 3 best-scored candidates, best first (equal scores: lower index), same numbering as ``target``;
- ``hits_at``: the requested ks at which the query is a hit, exactly as recall@k counts it under the tie rule
  (``--ties``); ``correct1`` / ``correct5``: the same at k = 1 / 5 when those are requested;
- ``tied``: whether its hit or miss at some k was the tie rule's choice (a tie across the cut-off).

recall@k = float32(count of rows whose ``hits_at`` has k) / float32(rows) of the direction (clip_benchmark's
float32 mean, bit for bit); mrr@k = mean of 1/rank over rows with rank <= k (0 otherwise); mean_rank / median_rank =
mean / median of ``rank`` over rows with one; text -> image ndcg@k = mean of 1/log2(rank + 1) within k. Image -> text
ndcg@k (several captions per image) needs every caption's rank: when it is asked, ``image_caption`` rows hold them
(``sample_index``: the image, ``target``: the caption, ``rank``), in caption order within each image, and
retrieval.ndcg_values over them gives it.

Text retrieval and any-to-any retrieval (units ``query`` and ``relevant_doc``): a ``query`` row per evaluated query
(``sample_key`` its id; ``target``, ``rank``, ``score``: its first relevant document; ``top``: the 3 best documents;
``hits_at``: the ks at which a relevant document is within the first k) and a ``relevant_doc`` row per judged
relevant document of each query (``sample_index`` / ``sample_key``: the query's; ``target``: the document;
``rank``, ``score``; ``value``: its gain), listed in rank order within the query. Documents are numbered by their
position in corpus.jsonl. nDCG, MAP, recall, precision and MRR @k are recomputed from the ``relevant_doc`` rows
(tasks/score/text_retrieval.py: per_query_metrics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from clipcache.storage.arrow_columns import Ragged
from clipcache.tasks.score.evidence import Evidence, Interval
from clipcache.tasks.score.intervals import interval, mean_statistic
from clipcache.tasks.score.ranking import DEFAULT_BLOCK_BYTES, ranked_positives
from clipcache.tasks.score.retrieval import captions_per_image, ndcg_values
from clipcache.tasks.score.retrieval_pass import QueryOutcomes
from clipcache.tasks.score.retrieval_queries import TOP


@dataclass
class RetrievalQueries:
    """Both directions' query outcomes from the score pass, with the dataset's numbering of its captions and images."""

    text: QueryOutcomes  # one per caption row (text -> image)
    image: QueryOutcomes  # one per image row (image -> text)
    ks: list[int]
    caption_index: np.ndarray  # the dataset caption position of each caption row
    image_index: np.ndarray  # the dataset position of each image row
    # with image -> text nDCG: per image row, the 0-based rank of each of its captions (caption order)
    caption_ranks: list[np.ndarray] | None = None


def _hit_columns(hits: np.ndarray, ks: list[int]) -> dict[str, Any]:
    columns: dict[str, Any] = {"hits_at": Ragged.from_mask(hits, ks)}
    for k in (1, 5):
        if k in ks:
            columns[f"correct{k}"] = hits[:, ks.index(k)].copy()
    return columns


def _masked(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    return np.ma.MaskedArray(values, mask=~present) if not present.all() else values


def retrieval_query_values(rank: np.ndarray, k: int, family: str) -> np.ndarray:
    """Per query, its term of the mean that ``family``@k is (rank: 1-based, 0 for a query without a positive)."""
    within = (rank > 0) & (rank <= k)
    safe = np.maximum(rank, 1).astype(np.float64)
    if family == "mrr":
        return np.where(within, 1.0 / safe, 0.0)
    return np.where(within, 1.0 / np.log2(safe + 1.0), 0.0)  # ndcg with one positive


def _direction(unit: str, prefix: str, outcome: QueryOutcomes, ks: list[int], own: np.ndarray,
               candidates: np.ndarray, *, families: tuple[str, ...], resamples: int, seed: int,
               one_positive: bool) -> Evidence:
    assert outcome.positive is not None and outcome.rank is not None and outcome.score is not None \
        and outcome.top is not None, "query outcomes without places"
    present = outcome.positive >= 0
    columns: dict[str, Any] = {
        "sample_index": own.astype(np.int64),
        "target": _masked(np.where(present, candidates[np.maximum(outcome.positive, 0)], 0), present),
        "top": candidates[outcome.top],
        "rank": _masked(outcome.rank, present),
        "score": _masked(np.nan_to_num(outcome.score), present),
        "tied": outcome.tied.any(axis=1),
        **_hit_columns(outcome.hits, ks),
    }
    intervals: dict[str, Interval] = {}
    n = len(outcome.hits)
    if resamples > 0 and n:
        def bounds(values: np.ndarray) -> Interval:
            return interval(mean_statistic(values), len(values), resamples=resamples, seed=seed)

        for j, k in enumerate(ks):
            if "recall" in families:
                intervals[f"{prefix}_recall@{k}"] = bounds(outcome.hits[:, j])
            if "mrr" in families:
                intervals[f"{prefix}_mrr@{k}"] = bounds(retrieval_query_values(outcome.rank, k, "mrr"))
            if "ndcg" in families and one_positive:
                intervals[f"{prefix}_ndcg@{k}"] = bounds(retrieval_query_values(outcome.rank, k, "ndcg"))
        if "rank" in families and present.any():
            intervals[f"{prefix}_mean_rank"] = bounds(outcome.rank[present])
    return Evidence(unit, columns, None, intervals)


def zeroshot_retrieval_evidence(queries: RetrievalQueries, families: tuple[str, ...] = ("recall",), *,
                                resamples: int, seed: int = 0, image_keys: list[str] | None = None) -> Evidence:
    """Rows of both directions (``text_query``, then ``image_query`` in ``more``) and the intervals of the metrics of
    ``families`` that are means over queries (recall, mrr, mean_rank; ndcg for text -> image). ``image_keys``: the
    images' own names (files, shard keys) in image-row order, where the dataset has them."""
    text = _direction("text_query", "image_retrieval", queries.text, queries.ks, queries.caption_index,
                      queries.image_index, families=families, resamples=resamples, seed=seed, one_positive=True)
    image = _direction("image_query", "text_retrieval", queries.image, queries.ks, queries.image_index,
                       queries.caption_index, families=families, resamples=resamples, seed=seed,
                       one_positive=False)
    image.keys = image_keys
    text.more.append(image)
    if queries.caption_ranks is not None:
        text.more.append(_image_captions(queries, families, resamples, seed, image))
    return text


def _image_captions(queries: RetrievalQueries, families: tuple[str, ...], resamples: int, seed: int,
                    image: Evidence) -> Evidence:
    """``image_caption`` rows: every caption's rank in its image's ranking (what image -> text nDCG is made of),
    in caption order within each image; the nDCG intervals join the image queries'."""
    assert queries.caption_ranks is not None and queries.text.positive is not None
    groups = captions_per_image(queries.text.positive, len(queries.image_index))  # text.positive: each caption's image
    counts = np.array([len(g) for g in groups], dtype=np.int64)
    columns = {"sample_index": np.repeat(queries.image_index, counts),
               "target": queries.caption_index[np.concatenate([*groups, np.empty(0, np.int64)])],
               "rank": np.concatenate([*queries.caption_ranks, np.empty(0, np.int64)]) + 1}
    if resamples > 0 and len(groups) and "ndcg" in families:
        for k in queries.ks:
            values = ndcg_values(queries.caption_ranks, k)
            image.intervals[f"text_retrieval_ndcg@{k}"] = interval(mean_statistic(values), len(values),
                                                                   resamples=resamples, seed=seed)
    keys = None if image.keys is None else [key for key, n in zip(image.keys, counts, strict=True) for _ in range(n)]
    return Evidence("image_caption", columns, keys)


@dataclass
class RankedQueries:
    """Text / any-to-any retrieval: per query, the 0-based rank, score and gain of each relevant document (in the
    qrels' order) and the best-scored documents."""

    ranks: list[np.ndarray]
    scores: list[np.ndarray]
    gains: list[np.ndarray]
    relevant: list[np.ndarray]  # document positions (the numbering rows are written in)
    top: np.ndarray  # (queries, <= 3) document positions, best first


def rank_text_queries(queries: np.ndarray, docs: np.ndarray, relevant: list[np.ndarray], gains: list[np.ndarray],
                      doc_index: np.ndarray | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES) -> RankedQueries:
    """Every relevant document's rank and score and each query's best documents, from one pass over the score
    rows (ranking.py); ``doc_index``: the position in corpus.jsonl of each row of ``docs`` (default: the row)."""
    ranks, scores, top = ranked_positives(queries.astype(np.float32, copy=False), docs.astype(np.float32, copy=False),
                                          relevant, block_bytes, top=TOP)
    index = np.arange(len(docs)) if doc_index is None else doc_index
    return RankedQueries(ranks, scores, gains, [index[r] for r in relevant], index[top])


def text_retrieval_evidence(ranked: RankedQueries, values: dict[str, np.ndarray], k_values: list[int], *,
                            query_index: np.ndarray, query_ids: list[str], resamples: int,
                            seed: int = 0) -> Evidence:
    """``query`` rows, ``relevant_doc`` rows (in ``more``) and an interval per metric; ``values``: each metric's
    per-query values (text_retrieval.per_query_metrics), of which the metric is the mean."""
    counts = np.array([len(r) for r in ranked.ranks], dtype=np.int64)
    order = [np.argsort(r) for r in ranked.ranks]  # relevant docs in rank order within each query
    ranks = np.concatenate([r[o] for r, o in zip(ranked.ranks, order, strict=True)])
    first = np.r_[0, np.cumsum(counts)[:-1]]
    docs = np.concatenate([d[o] for d, o in zip(ranked.relevant, order, strict=True)]).astype(np.int64)
    scores = np.concatenate([s[o] for s, o in zip(ranked.scores, order, strict=True)])
    gains = np.concatenate([g[o] for g, o in zip(ranked.gains, order, strict=True)])
    best_rank = ranks[first] + 1
    hits = np.stack([best_rank <= k for k in k_values], axis=1)
    queries = {"sample_index": query_index.astype(np.int64), "target": docs[first], "rank": best_rank,
               "score": scores[first], "top": ranked.top, **_hit_columns(hits, k_values)}
    judged = {"sample_index": np.repeat(query_index.astype(np.int64), counts), "target": docs, "rank": ranks + 1,
              "score": scores, "value": gains}
    intervals: dict[str, Interval] = {}
    if resamples > 0 and len(counts):
        intervals = {name: interval(mean_statistic(v), len(v), resamples=resamples, seed=seed)
                     for name, v in values.items()}
    keys = list(query_ids)
    evidence = Evidence("query", queries, keys, intervals)
    evidence.more.append(Evidence("relevant_doc", judged, [keys[q] for q in np.repeat(np.arange(len(keys)), counts)]))
    return evidence
