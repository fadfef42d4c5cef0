"""Ranks of positives under a deterministic tie rule, computed block by block with bounded memory.

Tie rule (used by every metric here): candidates are ordered by descending score, equal scores by ascending index —
what a stable sort gives. The rank of a positive (0 = best) is therefore::

    #{j : s_j > s_pos} + #{j < pos : s_j == s_pos}

torch.topk, which LAION clip_benchmark uses, leaves the order among exactly equal scores unspecified; with fp32
embeddings exact ties are vanishingly rare, so the numbers agree (tests check this against clip_benchmark itself).
With bf16/fp16 ties are common and this rule makes results reproducible where topk's are not.

Each query block computes its full score rows (block x n_candidates) and reads the positive's score from that same
row, so a positive is compared with bit-identical arithmetic. Memory is block_rows * n_candidates * 4 bytes; the block
is sized from a byte budget, never a dense queries x candidates matrix.
"""

from __future__ import annotations

import numpy as np

DEFAULT_BLOCK_BYTES = 256 * 1024 * 1024


def block_rows_for(n_candidates: int, block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
    return max(1, block_bytes // max(1, 4 * n_candidates))


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
) -> np.ndarray:
    """For each query, the best (smallest) rank among its positive candidates.

    ``positives`` is either an int array (one positive per query) or a list of int arrays (several per query; each
    must be non-empty). Scores are ``queries @ candidates.T`` computed in float32. With several positives the best
    one is the one ranked first, so one rank computation per query suffices.
    """
    n_q = len(queries)
    ranks = np.empty(n_q, dtype=np.int64)
    single = isinstance(positives, np.ndarray)
    block = block_rows_for(len(candidates), block_bytes)
    cand_t = np.ascontiguousarray(candidates.T)
    for start in range(0, n_q, block):
        stop = min(start + block, n_q)
        scores = queries[start:stop] @ cand_t
        chosen = positives[start:stop] if single else best_positive(scores, positives[start:stop])
        ranks[start:stop] = rank_of_positive_in_row(scores, chosen)
    return ranks


def all_positive_ranks(
    queries: np.ndarray,
    candidates: np.ndarray,
    positives: list[np.ndarray],
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> list[np.ndarray]:
    """The rank of every positive of every query (needed by nDCG with several relevant items per query)."""
    out: list[np.ndarray] = []
    block = block_rows_for(len(candidates), block_bytes)
    cand_t = np.ascontiguousarray(candidates.T)
    for start in range(0, len(queries), block):
        stop = min(start + block, len(queries))
        scores = queries[start:stop] @ cand_t
        group = positives[start:stop]
        counts = [len(p) for p in group]
        row_of = np.repeat(np.arange(stop - start), counts)
        cols = np.concatenate(group).astype(np.int64)
        ranks = np.empty(len(cols), dtype=np.int64)
        for s in range(0, len(cols), block):  # expanded rows in block-sized slices: memory stays bounded
            ranks[s:s + block] = rank_of_positive_in_row(scores[row_of[s:s + block]], cols[s:s + block])
        out.extend(np.split(ranks, np.cumsum(counts)[:-1]))
    return out
