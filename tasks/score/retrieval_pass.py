"""Recall@k in both directions from one pass over score tiles, with clip_benchmark's choice among tied scores.

clip_benchmark scores with ``scores = texts @ images.T`` (a dense float32 matrix, on the CPU) and, per k, keeps
``torch.topk(row, k)`` of every row (text -> image) and of every column (image -> text): a query is a hit when one
of its positives is kept. When scores tie across the k-th place, which index topk keeps is topk's choice.

Here the matrix is never built. One pass over tiles (captions x images, sized from a memory budget) keeps, per
query, the k largest scores (the running top-K of both directions share the tile) and the best positive's score.
Per query and k, with v_k the k-th largest score:

- positive > v_k + eps, or positive within eps of v_k while v_{k+1} < positive - eps (nothing outside the first k
  comes near it): a hit whatever the tie rule; positive < v_k - eps: a miss;
- otherwise (a tie, or a near-tie that another matrix-product kernel could round either way) the query is decided
  exactly: its full row is recomputed as clip_benchmark computes it (torch's float32 product on the CPU, in blocks
  of at least 16 rows so the kernel and its rounding are those of the full product) and ``torch.topk`` is called on
  it on the device clip_benchmark ran topk on. Such queries are few, so this costs little.

The tiles themselves may use the fastest product there is (NumPy's on the CPU here, cuBLAS on a GPU): eps covers
the rounding differences between kernels, and every decision within eps is made the exact way. A query is
tie-sensitive at k when its positive ties with the k-th score and the tie straddles the cut-off: its outcome is
topk's choice; these are counted and reported.

``rule="stable"`` decides those queries by rank instead (equal scores ordered by index, lowest first): numbers that
do not depend on the order of the data or on the device.

:func:`query_outcomes` keeps each query's outcome instead of only the counts: its hit or miss at every k (as the
counts count it), whether a tie decided it, and, with ``places``, where its best positive ranks (stable rule), that
positive's score and the 3 best-scored candidates, found in the same pass (tasks/score/retrieval_queries.py); ties
and near-ties there are settled on the exact scores of the tied block alone (tasks/score/retrieval_places.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from clipcache.tasks.score.ranking import decide_rows, positive_mask
from clipcache.tasks.score.retrieval_places import settle_both
from clipcache.tasks.score.retrieval_queries import (
    TOP,
    PositionCounter,
    fill_exact_places,
    merge_top,
    sorted_with_ids,
    top_per_column,
)

EPS = 1e-5  # |difference| between float32 products of unit vectors from different kernels is ~1e-7
MIN_BLOCK = 16  # below this many rows (or columns) the CPU kernel takes another path and rounds differently
SMALL_MATRIX = 1 << 22  # up to this many scores, exact rows come from the one full product clip_benchmark makes
TILE_WIDTH = 16_384  # images per score tile (its rows: as many captions as the memory budget allows)


@dataclass
class DirectionCounts:
    """Hits and tie-sensitive queries per k for one direction."""

    queries: int
    hits: dict[int, int] = field(default_factory=dict)
    tied: dict[int, int] = field(default_factory=dict)
    decided_exactly: int = 0


@dataclass
class QueryOutcomes:
    """Per query of one direction, in query order (captions for text->image, images for image->text)."""

    hits: np.ndarray  # (queries, len(ks)) bool: a hit at ks[j], exactly as recall@ks[j] counts it (the tie rule)
    tied: np.ndarray  # (queries, len(ks)) bool: tie-sensitive at ks[j] (the tie rule chose its outcome)
    decided_exactly: int = 0  # queries whose exact score row was recomputed
    # with places (else None): the best positive (stable rule; -1: the query has none), 1 + its stable rank (0: none),
    # its score (NaN: none) and the best-scored candidates, best first (equal scores: lower index first)
    positive: np.ndarray | None = None
    rank: np.ndarray | None = None
    score: np.ndarray | None = None
    top: np.ndarray | None = None

    def counts(self, ks: list[int]) -> DirectionCounts:
        return DirectionCounts(len(self.hits), {k: int(self.hits[:, j].sum()) for j, k in enumerate(ks)},
                               {k: int(self.tied[:, j].sum()) for j, k in enumerate(ks)}, self.decided_exactly)


@dataclass
class Scanned:
    """What one pass over the tiles keeps: per query, the top scores (descending) and the best positive's score
    (-inf for an image without captions); with a position counter, the candidates of those top scores too."""

    top_t2i: torch.Tensor  # [n_c, k_t2i]
    pos_t2i: torch.Tensor
    top_i2t: torch.Tensor  # [n_i, k_i2t]
    pos_i2t: torch.Tensor
    ids_t2i: torch.Tensor | None = None
    ids_i2t: torch.Tensor | None = None


class TileProduct:
    """Score tiles on the chosen device: NumPy's product on the CPU (the faster one here), torch's on a GPU."""

    def __init__(self, captions: torch.Tensor, images: torch.Tensor, rows: int, width: int):
        self.device = captions.device
        if self.device.type == "cpu":
            self._captions, self._images = captions.numpy(), images.numpy()
            # each column tile's images, transposed and contiguous, made once: a strided slice of one transposed
            # matrix would be copied by the product on every tile (a large temporary per tile)
            self._image_tiles: dict[tuple[int, int], np.ndarray] = {}
            # one output buffer for every tile: no allocation (and no page faults) per tile
            self._out = np.empty((rows + MIN_BLOCK) * (width + MIN_BLOCK), dtype=np.float32)
        else:
            self._captions_t, self._images_t_t = captions, images.T.contiguous()

    def __call__(self, c0: int, c1: int, i0: int, i1: int) -> torch.Tensor:
        if self.device.type == "cpu":
            if (i0, i1) not in self._image_tiles:
                self._image_tiles[i0, i1] = np.ascontiguousarray(self._images[i0:i1].T)
            out = self._out[: (c1 - c0) * (i1 - i0)].reshape(c1 - c0, i1 - i0)
            np.matmul(self._captions[c0:c1], self._image_tiles[i0, i1], out=out)
            return torch.from_numpy(out)
        return self._captions_t[c0:c1] @ self._images_t_t[:, i0:i1]


def top_values_per_column(x: torch.Tensor, k: int, group: int = 16) -> torch.Tensor:
    """The k largest values of every column (unsorted), exactly, at about the cost of one pass: topk along dim 0 of
    a row-major tile is strided and slow, so rows are grouped, the groups' maxima ranked (a contiguous reduction),
    and only the k best groups of each column searched: every top-k value lies in a group whose maximum is among
    the k best."""
    rows, width = x.shape
    if rows < 8 * k * group:
        return torch.topk(x, min(k, rows), dim=0, sorted=False).values
    usable = rows // group * group
    grouped = x[:usable].unflatten(0, (usable // group, group))  # (groups, group, width)
    best = torch.topk(grouped.amax(dim=1), k, dim=0, sorted=False).indices  # (k, width)
    picked = grouped[best, :, torch.arange(width, device=x.device)[None, :]]  # (k, width, group)
    candidates = picked.permute(0, 2, 1).reshape(k * group, width)
    if usable < rows:
        candidates = torch.cat([candidates, x[usable:]], dim=0)
    return torch.topk(candidates, k, dim=0, sorted=False).values


def _merge_topk(current: torch.Tensor | None, new: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    both = new if current is None else torch.cat([current, new], dim=dim)
    return torch.topk(both, min(k, both.shape[dim]), dim=dim, sorted=False).values


def _tile_shape(n_c: int, n_i: int, budget: int) -> tuple[int, int]:
    width = min(n_i, TILE_WIDTH)
    rows = max(MIN_BLOCK, budget // (4 * max(width, 1)))
    return min(rows, n_c), width


def _split(n: int, step: int) -> list[tuple[int, int]]:
    """[lo, hi) blocks of ``step``; a last block thinner than MIN_BLOCK joins the previous one."""
    bounds = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < MIN_BLOCK:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def scan(captions: torch.Tensor, images: torch.Tensor, caption_image: torch.Tensor, k_t2i: int, k_i2t: int,
         budget: int, *, counter: PositionCounter | None = None) -> Scanned:
    """One pass over the tiles: the top scores and the best positive's score per query of both directions; with
    ``counter``, the candidates of the top scores, and every tile counted into it."""
    n_c, n_i = len(captions), len(images)
    rows, width = _tile_shape(n_c, n_i, budget)
    product = TileProduct(captions, images, rows, width)
    device = captions.device
    top_t2i = torch.empty((n_c, k_t2i), device=device)
    pos_t2i = torch.full((n_c,), float("-inf"), device=device)
    top_i2t = torch.full((k_i2t, n_i), float("-inf"), device=device)
    pos_i2t = torch.full((n_i,), float("-inf"), device=device)
    if counter is not None:
        ids_t2i = torch.empty((n_c, k_t2i), dtype=torch.int64, device=device)
        ids_i2t = torch.full((k_i2t, n_i), -1, dtype=torch.int64, device=device)
    for c0, c1 in _split(n_c, rows):
        owner = caption_image[c0:c1]
        best_rows: torch.Tensor | None = None
        best: tuple[torch.Tensor, torch.Tensor] | None = None
        for i0, i1 in _split(n_i, width):
            tile = product(c0, c1, i0, i1)
            row_top = torch.topk(tile, min(k_t2i, i1 - i0), dim=1, sorted=False)
            if counter is None:
                best_rows = _merge_topk(best_rows, row_top.values, k_t2i, dim=1)
                column_top = top_values_per_column(tile, min(k_i2t, c1 - c0))
                top_i2t[:, i0:i1] = _merge_topk(top_i2t[:, i0:i1], column_top, k_i2t, dim=0)
            else:
                best = merge_top(best, (row_top.values, row_top.indices + i0), k_t2i, dim=1)
                values, at = top_per_column(tile, min(k_i2t, c1 - c0))
                top_i2t[:, i0:i1], ids_i2t[:, i0:i1] = merge_top((top_i2t[:, i0:i1], ids_i2t[:, i0:i1]),
                                                                 (values, at + c0), k_i2t, dim=0)
                counter.add(tile, c0, c1, i0, i1, tops=((row_top.values, row_top.indices), (values, at)))
            inside = torch.nonzero((owner >= i0) & (owner < i1)).squeeze(1)
            if len(inside):
                values = tile[inside, owner[inside] - i0]
                pos_t2i[c0 + inside] = values
                pos_i2t.scatter_reduce_(0, owner[inside], values, reduce="amax")
        if best is not None:
            top_t2i[c0:c1], ids_t2i[c0:c1] = best
        else:
            top_t2i[c0:c1] = best_rows  # type: ignore[assignment]
    if counter is None:
        return Scanned(torch.sort(top_t2i, dim=1, descending=True).values, pos_t2i,
                       torch.sort(top_i2t.T, dim=1, descending=True).values, pos_i2t)
    top_t2i, ids_t2i = sorted_with_ids(top_t2i, ids_t2i)
    top_i2t, ids_i2t = sorted_with_ids(top_i2t.T, ids_i2t.T)
    return Scanned(top_t2i, pos_t2i, top_i2t, pos_i2t, ids_t2i, ids_i2t)


def _decisions(top: torch.Tensor, positive: torch.Tensor, ks: list[int], n_candidates: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """(certain hits, undecided) per query and k (queries x len(ks)), whatever the tie rule and the kernel."""
    hits = torch.zeros((len(positive), len(ks)), dtype=torch.bool, device=positive.device)
    undecided = torch.zeros_like(hits)
    for j, k in enumerate(ks):
        if k > n_candidates:  # clip_benchmark raises here; every query with a positive is a hit
            hits[:, j] = torch.isfinite(positive)
            continue
        vk = top[:, k - 1]
        margin = EPS * torch.clamp(vk.abs(), min=1.0)
        next_value = top[:, k] if k < top.shape[1] else torch.full_like(vk, float("-inf"))
        near = positive >= vk - margin
        hit = (positive > vk + margin) | (near & (next_value < positive - margin))
        hits[:, j] = hit
        undecided[:, j] = near & ~hit
    return hits.cpu().numpy(), undecided.cpu().numpy()


class ExactScores:
    """Score rows exactly as clip_benchmark computes its matrix: ``texts @ images.T`` in float32 on the CPU.

    Rows are computed in blocks of at least 16 queries and 16 candidates (the product's kernel, and so its rounding,
    is then the full product's); candidates are copied to the host a block at a time, so the host never holds a
    second copy of a device's embeddings."""

    CANDIDATE_BLOCK = 65_536

    def __init__(self, captions: torch.Tensor, images: torch.Tensor, budget: int,
                 host: tuple[torch.Tensor, torch.Tensor] | None = None):
        """``host``: the same (captions, images) already in host memory, when the scoring device is a GPU."""
        self.captions, self.images = host if host is not None else (captions, images)
        self.budget = budget
        n_c, n_i = len(captions), len(images)
        self.full = captions.cpu() @ images.cpu().T if n_c * n_i <= SMALL_MATRIX else None

    def _groups(self, queries: torch.Tensor, length: int) -> list[torch.Tensor]:
        size = max(MIN_BLOCK, self.budget // (4 * max(length, 1)))
        return [queries[lo : lo + size] for lo in range(0, len(queries), size)]

    @staticmethod
    def _padded(indices: torch.Tensor) -> torch.Tensor:
        if len(indices) >= MIN_BLOCK:
            return indices
        return torch.cat([indices, indices[:1].repeat(MIN_BLOCK - len(indices))])

    def _host_blocks(self, rows: torch.Tensor) -> Iterator[torch.Tensor]:
        for lo, hi in _split(len(rows), self.CANDIDATE_BLOCK):
            yield rows[lo:hi].cpu()

    def caption_rows(self, queries: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Blocks of (caption indices, their rows over images)."""
        for group in self._groups(queries, len(self.images)):
            if self.full is not None:
                block = self.full[group]
            else:
                asked = self.captions[self._padded(group).to(self.captions.device)].cpu()
                block = _joined([asked @ images.T for images in self._host_blocks(self.images)], dim=1)
            yield group, block[: len(group)]

    def image_columns(self, queries: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Blocks of (image indices, their columns over captions)."""
        for group in self._groups(queries, len(self.captions)):
            if self.full is not None:
                block = self.full[:, group].T
            else:
                asked = self.images[self._padded(group).to(self.images.device)].cpu()
                block = _joined([captions @ asked.T for captions in self._host_blocks(self.captions)], dim=0).T
            yield group, block[: len(group)]


def recall_counts(captions: torch.Tensor, images: torch.Tensor, caption_image: torch.Tensor, ks: list[int],
                  budget: int, *, rule: str = "topk", topk_device: torch.device | None = None,
                  host: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[DirectionCounts, DirectionCounts]:
    """(text->image, image->text) hits and tie-sensitive queries per k. ``captions`` and ``images`` are L2-normalised
    float32 rows on the scoring device; ``caption_image[c]`` is the image of caption c; ``host``: the same two
    in host memory if the device is a GPU (the exact rows are computed on the CPU, as clip_benchmark does)."""
    t2i, i2t = query_outcomes(captions, images, caption_image, ks, budget, rule=rule, topk_device=topk_device,
                              host=host, places=False)
    return t2i.counts(ks), i2t.counts(ks)


def query_outcomes(captions: torch.Tensor, images: torch.Tensor, caption_image: torch.Tensor, ks: list[int],
                   budget: int, *, rule: str = "topk", topk_device: torch.device | None = None,
                   host: tuple[torch.Tensor, torch.Tensor] | None = None,
                   places: bool = True) -> tuple[QueryOutcomes, QueryOutcomes]:
    """(text->image, image->text) outcome of every query (arguments as :func:`recall_counts`); with ``places``,
    each query's best positive, its stable rank and score, and the best-scored candidates."""
    if rule not in ("topk", "stable"):
        raise ValueError(f"unknown tie rule {rule!r}")
    n_c, n_i = len(captions), len(images)
    topk_device = topk_device or captions.device
    # one value beyond the largest k: whether anything outside the first k comes near a positive at the k-th place
    depth = max(max(ks) + 1, TOP + 1 if places else 0)
    with torch.inference_mode(), _no_tf32():
        counter = PositionCounter(captions, images, caption_image, EPS) if places else None
        try:
            scanned = scan(captions, images, caption_image, min(depth, n_i), min(depth, n_c), budget, counter=counter)
        finally:
            if counter is not None:
                counter.close()
    owner = caption_image.cpu()
    has_caption = torch.zeros(n_i, dtype=torch.bool)
    has_caption[owner] = True
    hits_t2i, open_t2i = _decisions(scanned.top_t2i, scanned.pos_t2i, ks, n_i)
    hits_i2t, open_i2t = _decisions(scanned.top_i2t, scanned.pos_i2t, ks, n_c)
    open_i2t &= has_caption.numpy()[:, None]  # an image without captions is a miss
    t2i = QueryOutcomes(hits_t2i, np.zeros_like(hits_t2i))
    i2t = QueryOutcomes(hits_i2t, np.zeros_like(hits_i2t))
    redo_t2i, redo_i2t = open_t2i.any(axis=1), open_i2t.any(axis=1)
    exact: ExactScores | None = None
    row_places_t2i = row_places_i2t = np.zeros(0, dtype=bool)
    if counter is not None:
        exact = ExactScores(captions, images, budget, host)
        row_places_t2i, row_places_i2t = settle_both(t2i, i2t, counter, scanned, caption_image, exact, eps=EPS)
        redo_t2i |= row_places_t2i
        redo_i2t |= row_places_i2t
    if not (redo_t2i.any() or redo_i2t.any()):
        return t2i, i2t
    exact = exact or ExactScores(captions, images, budget, host)
    captions_of = _CaptionsPerImage(owner, n_i)
    for outcome, undecided, redo, row_places, blocks, positives_of, by_image in (
            (t2i, open_t2i, redo_t2i, row_places_t2i, exact.caption_rows, lambda q: owner[q : q + 1], False),
            (i2t, open_i2t, redo_i2t, row_places_i2t, exact.image_columns, captions_of, True)):
        queries = torch.from_numpy(np.flatnonzero(redo))
        outcome.decided_exactly = len(queries)
        for ids, rows in blocks(queries):
            asked = ids.numpy()
            open_ = undecided[asked]
            if open_.any():
                positive = positive_mask(asked, owner.numpy(), rows.shape[1], images=by_image)
                for j, k in enumerate(ks):
                    chosen = np.flatnonzero(open_[:, j])
                    if len(chosen):  # every row of a contiguous block: no copy
                        every = len(chosen) == len(rows) and rows.is_contiguous()
                        outcome.hits[asked[chosen], j], outcome.tied[asked[chosen], j] = decide_rows(
                            rows if every else rows[chosen], positive if every else positive[chosen], k, rule,
                            topk_device)
            if counter is not None:  # the few places the pass and the tied blocks could not settle
                on_row = np.flatnonzero(row_places[asked])
                if len(on_row):
                    fill_exact_places(outcome, asked[on_row], rows[on_row], positives_of)
    return t2i, i2t


def _joined(blocks: list[torch.Tensor], dim: int) -> torch.Tensor:
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=dim)


class _CaptionsPerImage:
    """An image's captions (ascending), sliced on demand: only the few images decided exactly ask (a list of one
    tensor per image cost more than those decisions on a tie-heavy set)."""

    def __init__(self, owner: torch.Tensor, n_images: int):
        self.order = torch.argsort(owner, stable=True)
        self.start = np.r_[0, np.cumsum(np.bincount(owner.numpy(), minlength=n_images))]

    def __call__(self, image: int) -> torch.Tensor:
        return self.order[self.start[image] : self.start[image + 1]]


class _no_tf32:
    """Float32 products in full precision on a GPU whatever the process set (TF32 would change the numbers)."""

    def __enter__(self) -> None:
        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.saved
