"""The places of the retrieval queries the pass's counts leave open (a tie or near-tie with the best positive, or
among the best-scored candidates), settled with work bounded by the tied block, not the row.

The pass (tasks/score/retrieval_queries.py) counts, per query, the candidates clearly above its best positive's
estimated score and keeps the candidates within the margin of it (its "window"). Every candidate outside the window
is above or below the best positive in any kernel's scores, so the exact stable rank is::

    1 + (clearly above) + (window candidates ahead of the best positive in clip_benchmark's own scores)

and only the window's scores need to be exact. Likewise the 3 best-scored candidates: anything scored below the
3rd best by more than the margin cannot be among them, so the exact order is that of the pass's kept top scores
that lie within the margin of the 3rd, when the kept list holds all of them. Exact scores are the entries of
clip_benchmark's matrix (``texts @ images.T``, torch float32 on the CPU) computed in blocks of at least 16 rows and
16 columns, whose kernel (and rounding) is the full product's.

A query whose block of ties at the top is larger than the kept list (and not held by its window) gets every
candidate scored within the margin of its 3rd place from its scores on torch's product (:func:`scored_at_least`;
any kernel will do for that bound), and only those are scored exactly and ordered: the exact work is the block's,
not the row's. A query whose window lacks a positive (nothing the margins allow) is placed on its exact row
(retrieval_queries.fill_exact_places).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from clipcache.tasks.score.ranking import MIN_BLOCK
from clipcache.tasks.score.retrieval_queries import TOP, PositionCounter, best_caption

if TYPE_CHECKING:
    from clipcache.tasks.score.retrieval_pass import ExactScores, QueryOutcomes, Scanned

PAIR_ROWS = 64  # captions per block of exact entries: the images their pairs ask stay few
BY_IMAGE = 4  # exact entries grouped by image where the pairs ask this many times fewer images than captions

Entries = Callable[[np.ndarray, np.ndarray], np.ndarray]
Block = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def exact_entries(exact: ExactScores, caption: np.ndarray, image: np.ndarray) -> np.ndarray:
    """clip_benchmark's scores at (caption[i], image[i]): blocks of the captions asked (at least MIN_BLOCK) times
    the images their pairs ask (at least MIN_BLOCK), or of the images asked times their pairs' captions where the
    pairs ask several times fewer images than captions (tied blocks: one image, many captions), so the work is the
    pairs' blocks, never whole rows. Either way the product is ``captions @ images.T``, as clip_benchmark's."""
    out = np.empty(len(caption), dtype=np.float32)
    if not len(out):
        return out
    if exact.full is not None:
        return exact.full.numpy()[caption, image]
    by_image = BY_IMAGE * len(np.unique(image)) < len(np.unique(caption))
    keys, others = (image, caption) if by_image else (caption, image)
    rows, row = np.unique(keys, return_inverse=True)  # the rows asked, and each pair's among them
    block = row.ravel() // PAIR_ROWS
    # each block's columns: the others its pairs ask, found for every block at once (sorted by block, then index)
    span = int(others.max()) + 1
    asked, col = np.unique(block * span + others, return_inverse=True)
    col = col.ravel()
    starts = np.searchsorted(asked // span, np.arange(block.max() + 2))
    order = np.argsort(block, kind="stable")
    ends = np.searchsorted(block[order], np.arange(block.max() + 2))
    for b in range(len(starts) - 1):
        at = order[ends[b] : ends[b + 1]]
        asked_rows, asked_cols = rows[b * PAIR_ROWS : (b + 1) * PAIR_ROWS], asked[starts[b] : starts[b + 1]] % span
        if by_image:
            scores = (_host_rows(exact.captions, asked_cols) @ _host_rows(exact.images, asked_rows).T).numpy().T
        else:
            scores = (_host_rows(exact.captions, asked_rows) @ _host_rows(exact.images, asked_cols).T).numpy()
        out[at] = scores[row.ravel()[at] - b * PAIR_ROWS, col[at] - starts[b]]
    return out


def _host_rows(embeddings: torch.Tensor, indices: np.ndarray) -> torch.Tensor:
    """Rows ``indices`` of ``embeddings`` in host memory, at least MIN_BLOCK of them (the first repeated): the
    product's kernel is then the full product's. On the CPU NumPy's gather (several times faster than torch's)."""
    if len(indices) < MIN_BLOCK:
        indices = np.r_[indices, np.repeat(indices[:1], MIN_BLOCK - len(indices))]
    if embeddings.device.type == "cpu":
        return torch.from_numpy(np.take(embeddings.numpy(), indices, axis=0))
    return embeddings[torch.from_numpy(indices).to(embeddings.device)].cpu()


def scored_at_least(exact: ExactScores, queries: np.ndarray, bound: np.ndarray, *, images: bool
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(query, candidate) of every candidate scored at or above its query's ``bound`` (``images``: the queries are
    images, the candidates captions): the queries' scores from torch's product with the query side first (a bound
    lies a margin below the score it guards, so any kernel's rounding is covered), a block of queries at a time."""
    mine, candidates = (exact.images, exact.captions) if images else (exact.captions, exact.images)
    step = max(MIN_BLOCK, exact.budget // (4 * max(len(candidates), 1)))
    found: list[tuple[np.ndarray, np.ndarray]] = []
    for lo in range(0, len(queries), step):
        asked, floor = queries[lo : lo + step], bound[lo : lo + step]
        at = torch.from_numpy(asked).to(candidates.device)
        hit = mine[at] @ candidates.T >= torch.from_numpy(floor).to(candidates.device)[:, None]
        row, column = (t.cpu().numpy() for t in torch.nonzero(hit, as_tuple=True))
        found.append((asked[row], column))
    if not found:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate([q for q, _ in found]), np.concatenate([c for _, c in found]).astype(np.int64)


def _stable_order(query: np.ndarray, candidate: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Order of the entries by query, then descending score, then ascending candidate (the stable rule)."""
    return np.lexsort((candidate, -score, query))


def settle_both(t2i: QueryOutcomes, i2t: QueryOutcomes, counter: PositionCounter, scanned: Scanned,
                caption_image: torch.Tensor, exact: ExactScores, *, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`settle_places` for both directions of one pass; returns which queries of each must be placed on
    their exact rows."""
    assert scanned.ids_t2i is not None and scanned.ids_i2t is not None  # scanned with the counter
    owner = caption_image.cpu().numpy()
    n_c, n_i = len(scanned.top_t2i), len(scanned.top_i2t)
    rows_t2i = settle_places(
        t2i, counter.places("t2i"), counter.window("t2i"), counter.floor("t2i"), scanned.pos_t2i, scanned.top_t2i,
        ids=scanned.ids_t2i, positive=owner.copy(), is_positive=lambda q, c: owner[q] == c,
        entries=lambda q, c: exact_entries(exact, q, c), n_candidates=n_i, eps=eps,
        block=lambda q, b: scored_at_least(exact, q, b, images=False))
    rows_i2t = settle_places(
        i2t, counter.places("i2t"), counter.window("i2t"), counter.floor("i2t"), scanned.pos_i2t, scanned.top_i2t,
        ids=scanned.ids_i2t, positive=best_caption(counter.estimate_t2i, caption_image, n_i),
        is_positive=lambda q, c: owner[c] == q, entries=lambda q, c: exact_entries(exact, c, q), n_candidates=n_c,
        eps=eps, block=lambda q, b: scored_at_least(exact, q, b, images=True))
    return rows_t2i, rows_i2t


def settle_places(outcome: QueryOutcomes, places: tuple[torch.Tensor, torch.Tensor],
                  window: tuple[np.ndarray, np.ndarray], floor: np.ndarray, score: torch.Tensor, top: torch.Tensor,
                  *, ids: torch.Tensor, positive: np.ndarray,
                  is_positive: Callable[[np.ndarray, np.ndarray], np.ndarray], entries: Entries, n_candidates: int,
                  eps: float, block: Block | None = None) -> np.ndarray:
    """Fill ``outcome``'s places: from the pass's counts (``places``: PositionCounter.places), ``window`` (its
    (query, candidate) entries, sorted by query) and ``floor`` (each window's lower end), the best positive's pass
    score, the sorted top scores and their candidates; ``entries(query, candidate)`` gives exact scores,
    ``is_positive(query, candidate)`` says which entries are positives; ``block(queries, bounds)`` (optional)
    gives every candidate of each query scored at or above its bound, in any kernel. Returns which queries must be
    placed on their exact rows."""
    above_plus_one, counted = (t.cpu().numpy() for t in places)
    has = positive >= 0
    outcome.positive = positive.copy()
    outcome.rank = np.where(has, above_plus_one, 0)
    outcome.score = np.where(has, score.cpu().numpy().astype(np.float64), np.nan)
    outcome.top = ids[:, : min(TOP, n_candidates)].cpu().numpy().copy()
    need_row = _settle_ranks(outcome, has & ~counted, window, is_positive, entries)
    # the windows and the kept list hold every candidate of a top block that starts within the positive's window
    window_holds = has & (above_plus_one - 1 < top.shape[1])
    need_row |= _settle_top(outcome, top.cpu().numpy(), ids.cpu().numpy(), (window, floor, window_holds, positive),
                            entries, n_candidates=n_candidates, eps=eps, block=block)
    return need_row


def _settle_ranks(outcome: QueryOutcomes, open_: np.ndarray, window: tuple[np.ndarray, np.ndarray],
                  is_positive: Callable[[np.ndarray, np.ndarray], np.ndarray], entries: Entries) -> np.ndarray:
    assert outcome.positive is not None and outcome.rank is not None and outcome.score is not None
    need_row = np.zeros(len(open_), dtype=bool)
    query, candidate = window
    keep = open_[query]
    query, candidate = query[keep], candidate[keep]
    score = entries(query, candidate)
    order = _stable_order(query, candidate, score)
    query, candidate, score = query[order], candidate[order], score[order]
    pos = np.flatnonzero(is_positive(query, candidate))
    placed, first = np.unique(query[pos], return_index=True)  # each query's first positive in the stable order
    best = pos[first]
    ahead = best - np.searchsorted(query, placed)
    outcome.rank[placed] += ahead
    outcome.positive[placed] = candidate[best]
    outcome.score[placed] = score[best].astype(np.float64)
    need_row[np.flatnonzero(open_)] = True
    need_row[placed] = False  # no positive within the margin: the margins say it cannot be, the row decides
    return need_row


def _settle_top(outcome: QueryOutcomes, top: np.ndarray, ids: np.ndarray,
                windows: tuple[tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray, np.ndarray], entries: Entries,
                *, n_candidates: int, eps: float, block: Block | None = None) -> np.ndarray:
    """The exact top places where two of the first places (or the last and the next) lie within the margin: among
    the candidates within the margin of the last place, taken from the kept list, or, when the tied block runs past
    it, from the kept list plus the best positive's window where that window reaches below the block, or else
    from ``block``: every candidate scored within the margin of the last place (the block of ties, whatever its
    size), found on the query's scores; without ``block`` those queries are placed on their exact rows."""
    assert outcome.top is not None
    (window_query, window_candidate), floor, window_holds, positive = windows
    n_top, width = outcome.top.shape[1], top.shape[1]
    need_row = np.zeros(len(top), dtype=bool)
    if n_top == 0:
        return need_row
    settled = np.ones(len(top), dtype=bool)
    for j in range(min(TOP, width - 1)):
        settled &= top[:, j] - top[:, j + 1] > eps * np.maximum(np.abs(top[:, j]), 1.0)
    last = top[:, n_top - 1]
    bound = last - eps * np.maximum(np.abs(last), 1.0)
    within = top >= bound[:, None]
    beyond_kept = within[:, -1] & (width < n_candidates)  # the block of ties may go on past the kept list
    from_window = ~settled & beyond_kept & window_holds & (bound >= floor)
    overflow = ~settled & beyond_kept & ~from_window
    if block is None:
        need_row[overflow] = True
        overflow[:] = False
    asked = np.flatnonzero(~settled & (~beyond_kept | from_window | overflow))
    if not len(asked):
        return need_row
    row, col = np.nonzero(within[asked])
    extra = from_window[window_query]
    wanted, blocked = np.flatnonzero(from_window), np.flatnonzero(overflow)
    block_query, block_candidate = block(blocked, bound[blocked]) if block is not None and len(blocked) else \
        (blocked, blocked)
    query = np.concatenate([asked[row], window_query[extra], wanted, block_query])
    candidate = np.concatenate([ids[asked[row], col], window_candidate[extra], positive[wanted], block_candidate])
    key = np.unique(query * n_candidates + candidate)
    query, candidate = key // n_candidates, key % n_candidates
    score = entries(query, candidate)
    order = _stable_order(query, candidate, score)
    query, candidate = query[order], candidate[order]
    start = np.searchsorted(query, asked)
    outcome.top[asked] = candidate[start[:, None] + np.arange(n_top)]
    return need_row
