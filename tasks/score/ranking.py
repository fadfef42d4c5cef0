"""Ranks of positives under a deterministic tie rule, computed block by block with bounded memory.

Tie rule (the "stable" rule; MRR, nDCG and mean/median rank always use it, recall@k with ``--ties stable``):
candidates are ordered by descending score, equal scores by ascending index — what a stable sort gives. The rank of a
positive (0 = best) is therefore::

    #{j : s_j > s_pos} + #{j < pos : s_j == s_pos}

The numbers then do not depend on which index torch.topk happens to keep among exactly equal scores (clip_benchmark's
recall@k does; the default recall path in retrieval_pass.py reproduces that choice instead).

Scores are computed as clip_benchmark computes its matrix, ``texts @ images.T`` in torch float32 on the CPU, in
blocks of at least ``MIN_BLOCK`` rows (the full product's kernel and rounding): an image's row is a column of that
product. So equal texts or equal images give bit-equal scores, and the ranks agree with the stable recall of
retrieval_pass.py query for query (NumPy's product does not round duplicates alike). Each query block computes its
full score rows and reads the positive's score from that same row. Memory is block_rows * n_candidates * 4 bytes; the
block is sized from a byte budget, never a dense queries x candidates matrix.
"""

from __future__ import annotations

import numpy as np
import torch

MIN_BLOCK = 16  # as retrieval_pass.MIN_BLOCK: below this many rows the CPU kernel rounds differently
DEFAULT_BLOCK_BYTES = 256 * 1024 * 1024


def block_rows_for(n_candidates: int, block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
    return max(1, block_bytes // max(1, 4 * n_candidates))


def score_rows(queries: np.ndarray, candidates: np.ndarray, start: int, stop: int,
               queries_are_images: bool) -> np.ndarray:
    """Scores of ``queries[start:stop]`` against every candidate, as rows of clip_benchmark's ``texts @ images.T``
    (its columns when the queries are the images); short blocks are widened to ``MIN_BLOCK`` rows and cut back."""
    lo = min(start, max(0, stop - MIN_BLOCK))
    asked = torch.from_numpy(np.ascontiguousarray(queries[lo:stop]))
    others = torch.from_numpy(np.ascontiguousarray(candidates))
    with torch.inference_mode():
        scores = (others @ asked.T).T if queries_are_images else asked @ others.T
    return scores[start - lo :].contiguous().numpy()


def rank_of_positive_in_row(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """Ranks of one positive per row: ``scores`` (q, n), ``positive`` (q,) column indices."""
    rows = np.arange(len(scores))
    pos_scores = scores[rows, positive][:, None]
    higher = np.count_nonzero(scores > pos_scores, axis=1)
    # Exact ties are rare in fp32: find the rows that have any (besides the positive itself), count only there.
    tied = np.count_nonzero(scores == pos_scores, axis=1) > 1
    if tied.any():
        t = np.flatnonzero(tied)
        cols = np.arange(scores.shape[1])[None, :]
        higher[t] += np.count_nonzero((scores[t] == pos_scores[t]) & (cols < positive[t, None]), axis=1)
    return higher.astype(np.int64)


def best_positive(scores: np.ndarray, positives: list[np.ndarray]) -> np.ndarray:
    """Per row, the positive column that comes first in the ranking (highest score, then lowest index)."""
    counts = np.fromiter((len(p) for p in positives), dtype=np.int64, count=len(positives))
    row_of = np.repeat(np.arange(len(positives)), counts)
    cols = np.concatenate(positives).astype(np.int64)
    order = np.lexsort((cols, -scores[row_of, cols], row_of))  # by row, then score desc, then column asc
    first = np.r_[0, np.cumsum(counts)[:-1]]
    return cols[order][first]


def best_positive_rank(
    queries: np.ndarray,
    candidates: np.ndarray,
    positives: list[np.ndarray] | np.ndarray,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    queries_are_images: bool = False,
) -> np.ndarray:
    """For each query, the best (smallest) rank among its positive candidates.

    ``positives`` is either an int array (one positive per query) or a list of int arrays (several per query; each
    must be non-empty). Scores come from :func:`score_rows` (``queries_are_images``: the queries are the images of
    ``texts @ images.T``). With several positives the best one is the one ranked first, so one rank computation per
    query suffices.
    """
    n_q = len(queries)
    ranks = np.empty(n_q, dtype=np.int64)
    block = max(MIN_BLOCK, block_rows_for(len(candidates), block_bytes))
    for start in range(0, n_q, block):
        stop = min(start + block, n_q)
        scores = score_rows(queries, candidates, start, stop, queries_are_images)
        if isinstance(positives, np.ndarray):
            chosen = positives[start:stop]
        else:
            chosen = best_positive(scores, positives[start:stop])
        ranks[start:stop] = rank_of_positive_in_row(scores, chosen)
    return ranks


def stable_top(scores: np.ndarray, n: int) -> np.ndarray:
    """The n best-scored columns of each row, best first, equal scores by lower index (n <= columns)."""
    if n == 0:
        return np.empty((len(scores), 0), dtype=np.int64)
    width = scores.shape[1]
    kth = np.partition(scores, width - n, axis=1)[:, width - n, None]
    r, c = np.nonzero(scores >= kth)  # at least n per row (more where scores tie with the n-th)
    order = np.lexsort((c, -scores[r, c], r))
    r, c = r[order], c[order]
    start = np.searchsorted(r, np.arange(len(scores)))
    return c[start[:, None] + np.arange(n)]


def all_positive_ranks(
    queries: np.ndarray,
    candidates: np.ndarray,
    positives: list[np.ndarray],
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    queries_are_images: bool = False,
) -> list[np.ndarray]:
    """The rank of every positive of every query (needed by nDCG with several relevant items per query)."""
    return ranked_positives(queries, candidates, positives, block_bytes, queries_are_images)[0]


def ranked_positives(
    queries: np.ndarray,
    candidates: np.ndarray,
    positives: list[np.ndarray],
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    queries_are_images: bool = False,
    top: int = 0,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """(the rank of every positive of every query, their scores, each query's ``top`` best-scored candidates best
    first, equal scores by lower index), from the same score rows."""
    ranks_out: list[np.ndarray] = []
    scores_out: list[np.ndarray] = []
    best = np.empty((len(queries), min(top, len(candidates))), dtype=np.int64)
    block = max(MIN_BLOCK, block_rows_for(len(candidates), block_bytes))
    for start in range(0, len(queries), block):
        stop = min(start + block, len(queries))
        scores = score_rows(queries, candidates, start, stop, queries_are_images)
        group = positives[start:stop]
        counts = [len(p) for p in group]
        row_of = np.repeat(np.arange(stop - start), counts)
        cols = np.concatenate(group).astype(np.int64)
        ranks = np.empty(len(cols), dtype=np.int64)
        for s in range(0, len(cols), block):  # expanded rows in block-sized slices: memory stays bounded
            ranks[s:s + block] = rank_of_positive_in_row(scores[row_of[s:s + block]], cols[s:s + block])
        cuts = np.cumsum(counts)[:-1]
        ranks_out.extend(np.split(ranks, cuts))
        scores_out.extend(np.split(scores[row_of, cols].astype(np.float64), cuts))
        best[start:stop] = stable_top(scores, best.shape[1])
    return ranks_out, scores_out, best


def decide_rows(rows: torch.Tensor, positive: np.ndarray, k: int, rule: str, topk_device: torch.device
                ) -> tuple[np.ndarray, np.ndarray]:
    """(hit, tie-sensitive) per exact score row (one query per row, on the CPU) at ``k`` under ``rule``: ``topk``,
    a hit when ``torch.topk(row, k)`` on ``topk_device`` keeps a positive (clip_benchmark's recall@k), or
    ``stable``, when the best positive's stable rank is below k; tie-sensitive when a positive ties with the k-th
    score and the tie straddles the cut-off. ``positive``: which entries of the rows are the query's positives (a
    boolean mask of the rows' shape)."""
    # one topk call for the block, on the device clip_benchmark ran topk on: its k-th value, and (rule topk) its choice
    found = torch.topk(rows.to(topk_device), k, dim=1)
    scores, kth = rows.numpy(), found.values[:, -1:].cpu().numpy()
    at_kth = scores == kth
    greater = np.count_nonzero(scores > kth, axis=1)
    tied = (positive & at_kth).any(axis=1) & (greater + np.count_nonzero(at_kth, axis=1) > k)
    if rule == "topk":  # a hit: a positive among the kept indices
        return np.take_along_axis(positive, found.indices.cpu().numpy(), axis=1).any(axis=1).astype(bool), tied
    # stable: the best positive (highest score, lowest index) ranks first among the positives; its rank is the
    # scores above it + the equal scores at lower indices
    best = np.where(positive, scores, -np.inf).max(axis=1, keepdims=True)
    first = np.argmax(positive & (scores == best), axis=1)
    before = np.arange(scores.shape[1])[None, :] < first[:, None]
    rank = np.count_nonzero(scores > best, axis=1) + np.count_nonzero((scores == best) & before, axis=1)
    return positive.any(axis=1) & (rank < k), tied


def positive_mask(queries: np.ndarray, owner: np.ndarray, width: int, *, images: bool) -> np.ndarray:
    """Which of ``width`` candidates are each query's positives: a caption's own image (text queries), an image's
    captions (``images``: image queries; ``owner[c]`` the image of caption c)."""
    if images:
        return owner[None, :] == queries[:, None]
    mask = np.zeros((len(queries), width), dtype=bool)
    mask[np.arange(len(queries)), owner[queries]] = True
    return mask
