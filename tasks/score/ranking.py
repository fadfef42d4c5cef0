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
    higher = (scores > pos_scores).sum(axis=1)
    cols = np.arange(scores.shape[1])[None, :]
    tied_before = ((scores == pos_scores) & (cols < positive[:, None])).sum(axis=1)
    return (higher + tied_before).astype(np.int64)


def best_positive_rank(
    queries: np.ndarray,
    candidates: np.ndarray,
    positives: list[np.ndarray] | np.ndarray,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> np.ndarray:
    """For each query, the best (smallest) rank among its positive candidates.

    ``positives`` is either an int array (one positive per query) or a list of int arrays (several per query; each
    must be non-empty). Scores are ``queries @ candidates.T`` computed in float32.
    """
    n_q = len(queries)
    ranks = np.empty(n_q, dtype=np.int64)
    single = isinstance(positives, np.ndarray)
    block = block_rows_for(len(candidates), block_bytes)
    cand_t = np.ascontiguousarray(candidates.T)
    for start in range(0, n_q, block):
        stop = min(start + block, n_q)
        scores = queries[start:stop] @ cand_t
        if single:
            ranks[start:stop] = rank_of_positive_in_row(scores, positives[start:stop])
            continue
        # Several positives per query: expand each row once per positive, keep the best rank.
        group = positives[start:stop]
        counts = np.fromiter((len(p) for p in group), dtype=np.int64, count=len(group))
        row_of = np.repeat(np.arange(stop - start), counts)
        cols = np.concatenate(group)
        best = np.full(stop - start, np.iinfo(np.int64).max, dtype=np.int64)
        # Expanding every positive at once could exceed the budget; walk the expansion in row-sized slices.
        step = block
        for s in range(0, len(cols), step):
            r = row_of[s : s + step]
            rk = rank_of_positive_in_row(scores[r], cols[s : s + step])
            np.minimum.at(best, r, rk)
        ranks[start:stop] = best
    return ranks
