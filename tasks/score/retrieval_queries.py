"""Where each retrieval query's best positive ranks, found during the recall pass (tasks/score/retrieval_pass.py).

The rank is ranking.py's stable rule on clip_benchmark's matrix (torch's float32 product on the CPU): 1 + the
candidates scored above the best positive + the candidates scored equal to it at lower indices. The pass's tiles
may come from another kernel (NumPy's product, cuBLAS), whose scores differ from that matrix's by ~1e-7, so the
tiles only decide what no such difference can change:

- before the pass, each query's best positive score is estimated (row dot products: one more kernel, same error);
- on every tile, per query of each direction, two counts against that estimate ``p`` with margin ``m`` (EPS):
  candidates above ``p + m`` (above in any kernel's scores) and candidates at or above ``p - m``;
- a query with exactly one candidate within ``[p - m, p + m]`` (its best positive itself) has rank above + 1 in
  every kernel; for the others (an exact or near tie with the best positive, or two near-equal positives) the pass
  keeps the candidates within that window, and tasks/score/retrieval_places.py ranks them on clip_benchmark's exact
  scores: work in proportion to the tied block, not the row.

The 3 best candidates come from the pass's running top-k, kept with their indices (ordered by score, equal scores
by lower index); where two of the first 4 scores lie within the margin, retrieval_places.py orders the tied block
on exact scores too, so ``top`` is the stable order of clip_benchmark's matrix for every query.

On the CPU most queries are counted off the tile: the pass keeps each tile's largest values per row and per column
(with where they lie) anyway, and where the smallest of them is below a query's window, every candidate at or above
the window is among them, so the counts and window entries come from those few values. The other queries (those
ranked deeper than the pass keeps) are counted on the tile, four comparisons per element of their rows (or columns),
in row chunks that stay in the cache, split between threads (NumPy's comparisons are several times faster than
torch's here and release the GIL). On a GPU the counts are torch operations on the whole tile.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from clipcache.tasks.score.ranking import best_positive, rank_of_positive_in_row, stable_top

if TYPE_CHECKING:
    from clipcache.tasks.score.retrieval_pass import QueryOutcomes

TOP = 3  # best-scored candidates kept per query (a report shows them)
CHUNK_ROWS = 64  # rows of a tile compared at once: a chunk of 16,384 columns stays in the last-level cache
DOT_BLOCK = 8192  # query rows per block of the positive-score estimate
DEEP_COLUMNS = 0.25  # above this share of a tile's columns to count on the tile, every column is counted there

WindowEntries = tuple[np.ndarray, np.ndarray]  # (query, candidate) index arrays of window entries


class PositionCounter:
    """Per query of both directions, while the tiles go by: the candidates above the best positive's estimated score
    by more than the margin (``above``) and those within the margin (``near``, the best positive included)."""

    def __init__(self, captions: torch.Tensor, images: torch.Tensor, caption_image: torch.Tensor, eps: float):
        n_c, n_i = len(captions), len(images)
        estimate = torch.empty(n_c, device=captions.device)
        for lo in range(0, n_c, DOT_BLOCK):
            hi = min(lo + DOT_BLOCK, n_c)
            if captions.device.type == "cpu":  # NumPy's row dot products: several times faster than torch's here
                estimate.numpy()[lo:hi] = np.einsum("ij,ij->i", captions[lo:hi].numpy(),
                                                    images.numpy()[caption_image[lo:hi].numpy()])
            else:
                estimate[lo:hi] = (captions[lo:hi] * images[caption_image[lo:hi]]).sum(dim=1)
        per_image = torch.full((n_i,), float("-inf"), device=captions.device)
        per_image.scatter_reduce_(0, caption_image, estimate, reduce="amax")
        self.estimate_t2i, self.estimate_i2t = estimate, per_image
        self._bounds = {}
        for name, p in (("t2i", estimate), ("i2t", per_image)):
            margin = eps * torch.clamp(p.abs(), min=1.0)
            self._bounds[name] = (p + margin, p - margin)
        self._cpu = captions.device.type == "cpu"
        self._threads = torch.get_num_threads()
        self._executor: ThreadPoolExecutor | None = None
        if self._cpu:  # NumPy views of the bounds, and int64 counts (a chunk adds int32 column sums)
            self._np = {name: (hi.numpy(), lo.numpy()) for name, (hi, lo) in self._bounds.items()}
        device = captions.device
        # the candidates within the margin of a query's best positive (its "window"): only where the window holds
        # more than the best positive itself, so their number is bounded by the tied blocks, not by the rows
        self._owner = caption_image
        self._window_t2i: list[tuple[np.ndarray, np.ndarray] | tuple[torch.Tensor, torch.Tensor]] = []
        self._window_i2t: list[tuple[np.ndarray, np.ndarray] | tuple[torch.Tensor, torch.Tensor]] = []
        self.above_t2i = torch.zeros(n_c, dtype=torch.int64, device=device)
        self.at_least_t2i = torch.zeros(n_c, dtype=torch.int64, device=device)
        self.above_i2t = torch.zeros(n_i, dtype=torch.int64, device=device)
        self.at_least_i2t = torch.zeros(n_i, dtype=torch.int64, device=device)

    def add(self, tile: torch.Tensor, c0: int, c1: int, i0: int, i1: int, *,
            tops: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """Count one tile: captions c0:c1 (its rows) x images i0:i1 (its columns). ``tops``: the tile's largest
        values per row and per column and where they lie (tile-local column and row indices), as the pass found
        them: on the CPU, a query whose window lies within them is counted from them, not from the tile."""
        if self._cpu:
            self._add_numpy(tile.numpy(), (c0, c1, i0, i1), tops)
            return
        hi, lo = self._bounds["t2i"]
        self.above_t2i[c0:c1] += (tile > hi[c0:c1, None]).sum(dim=1)
        self.at_least_t2i[c0:c1] += (tile >= lo[c0:c1, None]).sum(dim=1)
        rows, cols = torch.nonzero((tile >= lo[c0:c1, None]) & (tile <= hi[c0:c1, None]), as_tuple=True)
        self._window_t2i.append((rows + c0, cols + i0))
        hi, lo = self._bounds["i2t"]
        self.above_i2t[i0:i1] += (tile > hi[None, i0:i1]).sum(dim=0)
        self.at_least_i2t[i0:i1] += (tile >= lo[None, i0:i1]).sum(dim=0)
        rows, cols = torch.nonzero((tile >= lo[None, i0:i1]) & (tile <= hi[None, i0:i1]), as_tuple=True)
        self._window_i2t.append((cols + i0, rows + c0))

    def _add_numpy(self, x: np.ndarray, span: tuple[int, int, int, int],
                   tops: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        c0, c1, i0, i1 = span
        deep_rows, deep_columns = np.ones(c1 - c0, dtype=bool), None
        if tops is not None:  # most queries rank within the kept depth: counted from the tops, off the tile
            deep_rows = self._rows_from_top(span, tops[0][0].numpy(), tops[0][1].numpy())
            deep_columns = self._columns_from_top(span, tops[1][0].numpy(), tops[1][1].numpy())
        # NumPy's comparisons run on one core and release the GIL: the tile's rows are split between threads
        parts = np.array_split(np.arange(len(x)), max(1, min(self._threads, len(x) // CHUNK_ROWS)))
        spans = [(int(p[0]), int(p[-1]) + 1) for p in parts if len(p)]

        def count(rows: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, list[WindowEntries], list[WindowEntries]]:
            return self._count_rows(x, span, rows, deep_rows, deep_columns)

        columns = [count(spans[0])] if len(spans) == 1 else list(self._pool().map(count, spans))
        at = slice(i0, i1) if deep_columns is None else i0 + deep_columns
        for col_above, col_at_least, window_t2i, window_i2t in columns:
            self.above_i2t.numpy()[at] += col_above
            self.at_least_i2t.numpy()[at] += col_at_least
            self._window_t2i.extend(window_t2i)
            self._window_i2t.extend(window_i2t)

    def _rows_from_top(self, span: tuple[int, int, int, int], values: np.ndarray, where: np.ndarray) -> np.ndarray:
        """Count the tile's rows whose every candidate at or above the window's lower end is among the row's top
        values (the smallest of them lies below it); return which rows (tile-local) must be counted on the tile."""
        c0, c1, i0, i1 = span
        row_hi, row_lo = (b[c0:c1] for b in self._np["t2i"])
        if values.shape[1] >= i1 - i0:  # the top holds the whole row
            deep = np.zeros(c1 - c0, dtype=bool)
        else:
            deep = values.min(axis=1) >= row_lo
        shallow = np.flatnonzero(~deep)
        values, where, hi, lo = values[shallow], where[shallow], row_hi[shallow, None], row_lo[shallow, None]
        above, at_least = (values > hi).sum(axis=1), (values >= lo).sum(axis=1)
        self.above_t2i.numpy()[c0 + shallow] += above
        self.at_least_t2i.numpy()[c0 + shallow] += at_least
        owner = self._owner.numpy()[c0 + shallow]
        wide = np.flatnonzero(at_least - above > ((owner >= i0) & (owner < i1)))  # more than its own image
        if len(wide):
            r, j = np.nonzero((values[wide] >= lo[wide]) & (values[wide] <= hi[wide]))
            self._window_t2i.append((c0 + shallow[wide[r]], i0 + where[wide[r], j]))
        return deep

    def _columns_from_top(self, span: tuple[int, int, int, int], values: np.ndarray, where: np.ndarray
                          ) -> np.ndarray | None:
        """As :meth:`_rows_from_top` for the tile's columns; returns the (tile-local) columns to count on the tile,
        None for all of them (where most are: picking a few columns out of each row costs more than comparing)."""
        c0, c1, i0, i1 = span
        col_hi, col_lo = (b[i0:i1] for b in self._np["i2t"])
        if values.shape[0] >= c1 - c0:
            deep = np.zeros(i1 - i0, dtype=bool)
        else:
            deep = values.min(axis=0) >= col_lo
        if deep.sum() > DEEP_COLUMNS * (i1 - i0):
            return None
        shallow = np.flatnonzero(~deep)
        values, where, hi, lo = values[:, shallow], where[:, shallow], col_hi[shallow], col_lo[shallow]
        self.above_i2t.numpy()[i0 + shallow] += (values > hi).sum(axis=0)
        self.at_least_i2t.numpy()[i0 + shallow] += (values >= lo).sum(axis=0)
        j, s = np.nonzero((values >= lo) & (values <= hi))
        self._window_i2t.append((i0 + shallow[s], c0 + where[j, s]))
        return np.flatnonzero(deep)

    def _count_rows(self, x: np.ndarray, span: tuple[int, int, int, int], rows: tuple[int, int],
                    deep_rows: np.ndarray, deep_columns: np.ndarray | None
                    ) -> tuple[np.ndarray, np.ndarray, list[WindowEntries], list[WindowEntries]]:
        """Count tile rows start:stop: those of ``deep_rows`` into the row counts; return the counts of
        ``deep_columns`` (None: every column) over these rows and the window entries found ((query, candidate)
        index arrays of each direction)."""
        (c0, _, i0, i1), (start, stop) = span, rows
        (row_hi, row_lo), (col_hi, col_lo) = self._np["t2i"], self._np["i2t"]
        col_hi, col_lo = col_hi[i0:i1], col_lo[i0:i1]
        if deep_columns is not None:
            col_hi, col_lo = col_hi[deep_columns], col_lo[deep_columns]
        above, at_least = self.above_t2i.numpy(), self.at_least_t2i.numpy()
        owner = self._owner.numpy()
        col_above = np.zeros(len(col_hi), dtype=np.int64)
        col_at_least = np.zeros(len(col_hi), dtype=np.int64)
        window_t2i: list[WindowEntries] = []
        window_i2t: list[WindowEntries] = []
        # (above the window, at or above its lower end) masks: the window is where they differ (the first lies
        # within the second), so its entries come from the masks, not from comparing the scores again
        row_masks = np.empty((2, min(CHUNK_ROWS, stop - start), i1 - i0), dtype=bool)
        col_masks = np.empty((2, min(CHUNK_ROWS, stop - start), len(col_hi)), dtype=bool)
        for lo in range(start, stop, CHUNK_ROWS):
            chunk = x[lo : min(lo + CHUNK_ROWS, stop)]
            # sums over the bytes of the mask in uint16 (a row holds at most TILE_WIDTH + MIN_BLOCK < 65,536
            # columns, a chunk CHUNK_ROWS rows): about 3x faster than count_nonzero or int32 sums here
            picked = np.flatnonzero(deep_rows[lo : lo + len(chunk)])
            if len(picked):
                part = chunk if len(picked) == len(chunk) else chunk[picked]
                at = c0 + lo + picked
                over, reach = row_masks[0, : len(part)], row_masks[1, : len(part)]
                np.greater(part, row_hi[at, None], out=over)
                row_above = np.add.reduce(over.view(np.uint8), axis=1, dtype=np.uint16).astype(np.int64)
                np.greater_equal(part, row_lo[at, None], out=reach)
                row_at_least = np.add.reduce(reach.view(np.uint8), axis=1, dtype=np.uint16).astype(np.int64)
                above[at] += row_above
                at_least[at] += row_at_least
                # a caption's own image lies in its window (in the tile that holds it): only more than that is kept
                own = (owner[at] >= i0) & (owner[at] < i1)
                wide = np.flatnonzero(row_at_least - row_above > own)
                if len(wide):
                    r, c = np.nonzero(reach[wide] ^ over[wide])
                    window_t2i.append((at[wide[r]], i0 + c))
            if not len(col_hi):
                continue
            part = chunk if deep_columns is None else chunk[:, deep_columns]
            over, reach = col_masks[0, : len(part)], col_masks[1, : len(part)]
            np.greater(part, col_hi, out=over)
            chunk_above = np.add.reduce(over.view(np.uint8), axis=0, dtype=np.uint16)
            np.greater_equal(part, col_lo, out=reach)
            chunk_at_least = np.add.reduce(reach.view(np.uint8), axis=0, dtype=np.uint16)
            col_above += chunk_above
            col_at_least += chunk_at_least
            wide = np.flatnonzero(chunk_at_least != chunk_above)
            if len(wide):
                r, c = np.nonzero(reach[:, wide] ^ over[:, wide])
                column = wide[c] if deep_columns is None else deep_columns[wide[c]]
                window_i2t.append((i0 + column, c0 + lo + r))
        return col_above, col_at_least, window_t2i, window_i2t

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="clipcache-count")
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def window(self, direction: str) -> tuple[np.ndarray, np.ndarray]:
        """(query, candidate) of the window entries of ``direction`` (t2i or i2t), every query with more than its
        best positive in its window included (a caption's own image too), in no order, without repeats."""
        found = self._window_t2i if direction == "t2i" else self._window_i2t
        queries = [np.asarray(q.cpu() if isinstance(q, torch.Tensor) else q, dtype=np.int64) for q, _ in found]
        others = [np.asarray(c.cpu() if isinstance(c, torch.Tensor) else c, dtype=np.int64) for _, c in found]
        query = np.concatenate(queries) if queries else np.empty(0, np.int64)
        candidate = np.concatenate(others) if others else np.empty(0, np.int64)
        if direction == "t2i":  # the caption's own image, where it was left out of a tile's entries
            owner = self._owner.cpu().numpy()
            asked = np.unique(query)
            query, candidate = np.r_[query, asked], np.r_[candidate, owner[asked]]
        n = max(len(self.above_t2i), len(self.above_i2t))
        key = np.unique(query * n + candidate)
        return key // n, key % n

    def places(self, direction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(1 + candidates clearly above the best positive, whether that is its exact stable rank: nothing but the
        best positive lies within the margin of it) per query of ``direction`` (t2i or i2t)."""
        above, at_least = (self.above_t2i, self.at_least_t2i) if direction == "t2i" else \
            (self.above_i2t, self.at_least_i2t)
        return above + 1, at_least - above == 1

    def floor(self, direction: str) -> np.ndarray:
        """The lower end of each query's window (its best positive's estimated score less the margin)."""
        return self._bounds[direction][1].cpu().numpy()


def best_caption(estimate: torch.Tensor, caption_image: torch.Tensor, n_images: int) -> np.ndarray:
    """Per image, its caption with the highest estimated score (lowest index among equal ones); -1 without one.
    Only used where that caption is the only one within the margin, so the estimate's kernel does not matter."""
    score, owner = estimate.cpu().numpy(), caption_image.cpu().numpy()
    order = np.lexsort((np.arange(len(owner)), -score, owner))
    first = np.r_[True, owner[order][1:] != owner[order][:-1]] if len(order) else np.empty(0, bool)
    best = np.full(n_images, -1, dtype=np.int64)
    best[owner[order][first]] = order[first]
    return best


def sorted_with_ids(values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's values descending, equal values by lower id, and their ids in the same order."""
    by_id = torch.argsort(ids, dim=1)
    values, ids = values.gather(1, by_id), ids.gather(1, by_id)
    by_value = torch.sort(values, dim=1, descending=True, stable=True).indices
    return values.gather(1, by_value), ids.gather(1, by_value)


def top_per_column(x: torch.Tensor, k: int, group: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """retrieval_pass.top_values_per_column with the row of each value: the k largest values of every column
    (unsorted) and their row indices."""
    rows, width = x.shape
    if rows < 8 * k * group:
        found = torch.topk(x, min(k, rows), dim=0, sorted=False)
        return found.values, found.indices
    usable = rows // group * group
    grouped = x[:usable].unflatten(0, (usable // group, group))  # (groups, group, width)
    best = torch.topk(grouped.amax(dim=1), k, dim=0, sorted=False).indices  # (k, width)
    picked = grouped[best, :, torch.arange(width, device=x.device)[None, :]]  # (k, width, group)
    candidates = picked.permute(0, 2, 1).reshape(k * group, width)  # slot s: member s % group of group best[s // group]
    if usable < rows:
        candidates = torch.cat([candidates, x[usable:]], dim=0)
    found = torch.topk(candidates, k, dim=0, sorted=False)
    slot = found.indices
    in_group = slot < k * group
    slot_group = best.gather(0, torch.where(in_group, slot // group, 0))
    row = torch.where(in_group, slot_group * group + slot % group, usable + slot - k * group)
    return found.values, row


def merge_top(current: tuple[torch.Tensor, torch.Tensor] | None, new: tuple[torch.Tensor, torch.Tensor], k: int,
              dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of two (values, ids) sets along ``dim``, with their ids."""
    values, ids = new if current is None else (torch.cat([current[0], new[0]], dim=dim),
                                               torch.cat([current[1], new[1]], dim=dim))
    found = torch.topk(values, min(k, values.shape[dim]), dim=dim, sorted=False)
    return found.values, ids.gather(dim, found.indices)


def fill_exact_places(outcome: QueryOutcomes, queries: np.ndarray, rows: torch.Tensor,
                      positives_of: Callable[[int], torch.Tensor]) -> None:
    """Places of ``queries`` from their exact score rows: ranking.py's rule on clip_benchmark's numbers."""
    assert outcome.positive is not None and outcome.rank is not None and outcome.score is not None \
        and outcome.top is not None
    scores = rows.numpy()
    own = [positives_of(int(q)).numpy() for q in queries]
    at = np.flatnonzero([len(p) > 0 for p in own])
    if len(at):
        best = best_positive(scores[at], [own[i] for i in at])
        outcome.positive[queries[at]] = best
        outcome.rank[queries[at]] = rank_of_positive_in_row(scores[at], best) + 1
        outcome.score[queries[at]] = scores[at, best]
    outcome.top[queries] = stable_top(scores, outcome.top.shape[1])
