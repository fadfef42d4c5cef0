"""Composed image retrieval (CIRR, FashionIQ; MIEB's CIRRIT2IRetrieval / FashionIQIT2IRetrieval): each query is a
reference image plus a modifying text, the documents are the gallery's images.

The rule is mteb 2.x's for these tasks (``AbsTaskRetrieval``, its ``RetrievalEvaluator`` and pytrec_eval), with
CIRR's one addition where asked:

- the query vector is the sum of the reference image's and the text's embeddings (``text_embeddings +
  image_embeddings``, what mteb's CLIP and OpenCLIP wrappers return for an image + text input): the caller passes
  the raw features (cached row x its norm), so each side weighs by its norm as in mteb;
- every gallery image scores the cosine similarity ``normalize(query) @ normalize(image)`` (mteb's ``cos_sim``,
  torch float32);
- candidates rank as pytrec_eval ranks them: score descending, equal scores by document id descending *as text*;
- ``exclude_reference``: the reference image is no candidate (its score is -inf), as CIRR's own evaluation
  (``cirr`` eval server, CLIP4Cir's ``compute_cirr_val_metrics``) removes it; mteb keeps it (its query and corpus
  ids differ, so ``ignore_identical_ids`` never drops it). A reference that is also a target stays a candidate.

Every relevant image's 0-based rank then feeds tasks/score/text_retrieval.per_query_metrics (trec_eval's recall,
nDCG, ...): with CIRR's and FashionIQ's one target per query, ``recall@k`` is the fraction of queries whose target
is in the top k. Score rows are computed a block of queries at a time, never a dense queries x gallery matrix.

CIRR's ``Recall_subset@k`` (its official evaluation; CLIP4Cir's ``compute_cirr_val_metrics`` computes it the same
way): each query also ranks only its ``img_set`` members less its reference image (the caller passes those gallery
positions as ``subsets``), in the order of the full ranking, here the order above; a target's subset rank is the
members ahead of it in that order (-1 when it is no member: no hit at any k). ``subset_recall`` gives the per-query
values (the fraction of the query's targets within k of its subset).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from clipcache.tasks.score.ranking import DEFAULT_BLOCK_BYTES, block_rows_for
from clipcache.tasks.score.retrieval_evidence import RankedQueries

TOP = 3


@dataclass
class ComposedRanks:
    ranked: RankedQueries  # each target's rank (pytrec_eval's order), score and gain; the best candidates
    ahead: list[np.ndarray]  # per query, per target: candidates scored strictly higher
    level: list[np.ndarray]  # per query, per target: other candidates scored exactly the same
    subset: Subsets | None = None  # CIRR's Recall_subset ranks, when subsets were given

    def tied(self, k: int) -> np.ndarray:
        """Per query: whether a target's place within k or beyond it was decided by the id order among ties."""
        return _tied(self.ahead, self.level, k)


@dataclass
class Subsets:
    """Per query, per target: its 0-based rank among the query's subset (-1: not a member), the members scored
    strictly higher and the other members scored exactly the same."""

    ranks: list[np.ndarray]
    ahead: list[np.ndarray]
    level: list[np.ndarray]

    def recall(self, k: int) -> np.ndarray:
        """Per query: the fraction of its targets within the first k of its subset (``Recall_subset@k``)."""
        return np.array([float(((r >= 0) & (r < k)).mean()) for r in self.ranks])

    def tied(self, k: int) -> np.ndarray:
        return _tied([np.where(r >= 0, a, k) for r, a in zip(self.ranks, self.ahead, strict=True)], self.level, k)


def _tied(ahead: list[np.ndarray], level: list[np.ndarray], k: int) -> np.ndarray:
    return np.array([bool(((a < k) & (a + e >= k)).any()) for a, e in zip(ahead, level, strict=True)])


def id_order(ids: list[str]) -> np.ndarray:
    """Each id's place when the ids are sorted as text (pytrec_eval breaks ties by document id, descending)."""
    order = np.empty(len(ids), np.int64)
    order[sorted(range(len(ids)), key=ids.__getitem__)] = np.arange(len(ids))
    return order


def composed_ranks(image: np.ndarray, text: np.ndarray, gallery: np.ndarray, targets: list[np.ndarray],  # noqa: PLR0913
                   gains: list[np.ndarray], *, gallery_ids: list[str], excluded: np.ndarray | None = None,
                   subsets: list[np.ndarray] | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES) -> ComposedRanks:
    """``image`` / ``text``: each query's reference image and text vectors (n, d); ``gallery`` (m, d); per query its
    targets' gallery positions and gains; ``excluded``: per query a gallery position that is no candidate (-1:
    none); ``subsets``: per query the gallery positions of its Recall_subset candidates (distinct)."""
    n = len(targets)
    by_id = torch.from_numpy(id_order(gallery_ids))
    documents = torch.nn.functional.normalize(torch.from_numpy(np.ascontiguousarray(gallery, np.float32)), p=2, dim=1)
    fused = torch.from_numpy(np.ascontiguousarray(image + text, np.float32))  # float32, as mteb's fused embeddings
    ranks, scores, ahead, level, top = [], [], [], [], np.zeros((n, min(TOP, len(gallery))), np.int64)
    subset = Subsets([], [], []) if subsets is not None else None
    step = block_rows_for(len(gallery), block_bytes)
    for start in range(0, n, step):
        with torch.inference_mode():
            block = torch.nn.functional.normalize(fused[start:start + step], p=2, dim=1) @ documents.T
        for row in range(block.shape[0]):
            q = start + row
            s = block[row].clone()
            goal = torch.from_numpy(targets[q])
            if excluded is not None and excluded[q] >= 0 and not bool((goal == int(excluded[q])).any()):
                s[int(excluded[q])] = -torch.inf
            values = s[goal]
            higher = (s[None, :] > values[:, None]).sum(1)
            same = s[None, :] == values[:, None]
            above = (same & (by_id[None, :] > by_id[goal][:, None])).sum(1)
            ranks.append((higher + above).numpy().astype(np.int64))
            scores.append(values.numpy().astype(np.float64))
            ahead.append(higher.numpy().astype(np.int64))
            level.append((same.sum(1) - 1).numpy().astype(np.int64))
            # the best candidates in pytrec_eval's order (score, then id, descending)
            top[q] = np.lexsort((-by_id.numpy(), -s.numpy()))[:top.shape[1]]
            if subset is not None and subsets is not None:
                _rank_in_subset(subset, s, by_id, goal, torch.from_numpy(np.asarray(subsets[q], np.int64)))
    ranked = RankedQueries(ranks, scores, [np.asarray(g, np.float64) for g in gains],
                           [np.asarray(t, np.int64) for t in targets], top)
    return ComposedRanks(ranked, ahead, level, subset)


def _rank_in_subset(out: Subsets, s: torch.Tensor, by_id: torch.Tensor, goal: torch.Tensor,
                    members: torch.Tensor) -> None:
    """One query's targets ranked among its subset ``members`` in the full ranking's order (score, then id,
    descending): the rank is the members ahead of the target, whatever the gallery outside the subset holds."""
    member = (goal[:, None] == members[None, :]).any(1)
    values, others = s[goal], s[members]
    higher = (others[None, :] > values[:, None]).sum(1)
    same = (others[None, :] == values[:, None]) & (members[None, :] != goal[:, None])
    above = (same & (by_id[members][None, :] > by_id[goal][:, None])).sum(1)
    out.ranks.append(np.where(member.numpy(), (higher + above).numpy(), -1).astype(np.int64))
    out.ahead.append(higher.numpy().astype(np.int64))
    out.level.append(same.sum(1).numpy().astype(np.int64))
