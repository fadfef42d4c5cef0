"""Text-retrieval metrics over a BEIR-style qrels, defined as beir's EvaluateRetrieval reports them.

beir hands the top-k results to pytrec_eval (trec_eval's definitions) and averages over the evaluated queries;
MRR is beir's own. Here every relevant document's exact rank is computed (blocked, bounded memory), which gives the
same values for any k up to the depth beir retrieves. Relevant = qrels score > 0; nDCG uses the score as the gain.

- ``ndcg@k``: sum over relevant docs ranked within k of gain / log2(rank + 1) (1-based rank), divided by the ideal
  DCG@k of the judged relevant docs sorted by gain.
- ``map@k``: sum over relevant docs ranked within k of precision at their rank, divided by the number of relevant
  docs (trec_eval's map_cut).
- ``recall@k``: relevant docs ranked within k / relevant docs.  ``precision@k``: relevant docs within k / k.
- ``mrr@k``: 1 / rank of the first relevant doc within k, else 0.

Values are not rounded (beir rounds to 5 decimals when it reports). Ties: see tasks/score/ranking.py.
"""

from __future__ import annotations

import numpy as np

from clipcache.tasks.score.ranking import DEFAULT_BLOCK_BYTES, all_positive_ranks

FAMILIES = ("ndcg", "map", "recall", "precision", "mrr")


def text_retrieval_metrics(queries: np.ndarray, docs: np.ndarray, relevant: list[np.ndarray],
                           gains: list[np.ndarray], k_values: list[int],
                           block_bytes: int = DEFAULT_BLOCK_BYTES) -> dict[str, float]:
    """``relevant[q]``: doc indices with gain > 0 for query q (every q must have at least one); ``gains[q]``: their
    gains, same order."""
    ranks = all_positive_ranks(queries.astype(np.float32, copy=False), docs.astype(np.float32, copy=False),
                               relevant, block_bytes)
    return {name: float(values.mean()) for name, values in per_query_metrics(ranks, gains, k_values).items()}


def per_query_metrics(ranks: list[np.ndarray], gains: list[np.ndarray], k_values: list[int]
                      ) -> dict[str, np.ndarray]:
    """Each metric's value per query (``ndcg@10`` -> one float per query); a metric is the mean of its values.
    ``ranks[q]``: the 0-based rank of each of query q's relevant docs, ``gains[q]`` their gains. Sums run over the
    relevant docs in rank order, so the values are reproducible from rows listed in that order."""
    ordered = [(r[np.argsort(r)], g[np.argsort(r)]) for r, g in zip(ranks, gains, strict=True)]
    out: dict[str, np.ndarray] = {}
    for k in k_values:
        discounts = 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))
        ndcg, ap, recall, precision, rr = [], [], [], [], []
        for r, g in ordered:
            within = r < k
            ideal = np.sort(g)[::-1][:k]
            ndcg.append(float((g[within] * discounts[r[within]]).sum() / (ideal * discounts[: len(ideal)]).sum()))
            hits = r[within]
            ap.append(float((np.arange(1, len(hits) + 1) / (hits + 1)).sum() / len(r)))
            recall.append(within.sum() / len(r))
            precision.append(within.sum() / k)
            rr.append(1.0 / (r[0] + 1) if r[0] < k else 0.0)
        for family, values in zip(FAMILIES, (ndcg, ap, recall, precision, rr), strict=True):
            out[f"{family}@{k}"] = np.asarray(values, dtype=np.float64)
    return out
