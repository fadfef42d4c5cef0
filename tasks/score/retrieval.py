"""Zero-shot image-text retrieval metrics, defined as LAION clip_benchmark defines them, without a dense matrix.

- ``image_retrieval_recall@k`` (text -> image): each caption is a query; a hit if its image is among the top k images.
  Averaged over captions.
- ``text_retrieval_recall@k`` (image -> text): each image is a query; a hit if ANY of its captions is among the top k
  captions. Averaged over images. An image without captions counts as a miss (clip_benchmark divides 0 by 0 there,
  which also never counts as a hit).

Like clip_benchmark this is "CLIP-style" recall: a hit/miss per query, not the fraction of all relevant items found.
``k`` larger than the number of candidates makes every query a hit (clip_benchmark raises instead).

Further metrics (``--retrieval_metrics``), per direction ``image_retrieval_*`` / ``text_retrieval_*``:

- ``mrr@k``: mean over queries of 1 / (1-based rank of the best positive), 0 when that rank is beyond k.
- ``ndcg@k``: binary relevance; DCG@k = sum over positives ranked within k of 1 / log2(rank + 1) (1-based rank),
  divided by the ideal DCG of min(#positives, k) items. With one positive per query (text -> image) this is
  1 / log2(rank + 1) within k.
- ``mean_rank``, ``median_rank``: 1-based rank of the best positive (lower is better); images without captions are
  left out of these two.
"""

from __future__ import annotations

import numpy as np

from clipcache.tasks.score.ranking import DEFAULT_BLOCK_BYTES, all_positive_ranks, best_positive_rank

NO_POSITIVE = np.iinfo(np.int64).max


def captions_per_image(caption_image: np.ndarray, n_images: int) -> list[np.ndarray]:
    """Caption indices of each image, in caption order."""
    order = np.argsort(caption_image, kind="stable")
    counts = np.bincount(caption_image, minlength=n_images)
    return np.split(order, np.cumsum(counts)[:-1])


def retrieval_ranks(
    image_embeddings: np.ndarray,
    caption_embeddings: np.ndarray,
    caption_image: np.ndarray,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """(text->image rank per caption, image->text best rank per image).

    An image without captions gets ``NO_POSITIVE`` (larger than any k), so it is a miss at every k.
    """
    images = image_embeddings.astype(np.float32, copy=False)
    texts = caption_embeddings.astype(np.float32, copy=False)
    t2i = best_positive_rank(texts, images, caption_image.astype(np.int64), block_bytes)
    groups = captions_per_image(caption_image, len(images))
    has_caption = np.array([len(g) > 0 for g in groups], dtype=bool)
    i2t = np.full(len(images), NO_POSITIVE, dtype=np.int64)
    if has_caption.any():
        idx = np.flatnonzero(has_caption)
        i2t[idx] = best_positive_rank(images[idx], texts, [groups[i] for i in idx], block_bytes,
                                      queries_are_images=True)
    return t2i, i2t


def recall_at_k(hits: int, queries: int) -> float:
    """Fraction of queries that are hits, as float32 hits / float32 count, exactly like clip_benchmark's
    ``(...).float().mean()``: the reported value is bit-for-bit the one clip_benchmark writes (e.g. 2/17 ->
    0.11764705926179886, not 0.11764705882352941)."""
    if not queries:
        return float("nan")
    return float(np.float32(hits) / np.float32(queries))


def recall_from_ranks(ranks: np.ndarray, k: int) -> float:
    """recall@k from the best positive's rank per query (the stable rule)."""
    return recall_at_k(int((ranks < k).sum()), len(ranks))


def mrr_at_k(ranks: np.ndarray, k: int) -> float:
    hit = ranks < k
    return float(np.where(hit, 1.0 / (np.minimum(ranks, k) + 1.0), 0.0).mean()) if len(ranks) else float("nan")


def ndcg_at_k(positive_ranks: list[np.ndarray], k: int) -> float:
    """Mean nDCG@k over queries; ``positive_ranks[q]`` holds the 0-based ranks of all of query q's positives."""
    if not positive_ranks:
        return float("nan")
    return float(ndcg_values(positive_ranks, k).mean())


def ndcg_values(positive_ranks: list[np.ndarray], k: int) -> np.ndarray:
    """Each query's nDCG@k (0 for a query without positives); the DCG sums over the positives in the given order."""
    discounts = 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))
    values = []
    for ranks in positive_ranks:
        if len(ranks) == 0:
            values.append(0.0)
            continue
        dcg = discounts[ranks[ranks < k]].sum()
        values.append(dcg / discounts[: min(len(ranks), k)].sum())
    return np.asarray(values, dtype=np.float64)


def caption_ranks(image_embeddings: np.ndarray, caption_embeddings: np.ndarray, caption_image: np.ndarray,
                  block_bytes: int = DEFAULT_BLOCK_BYTES) -> list[np.ndarray]:
    """Per image, the 0-based rank of each of its captions (in caption order) among all captions, stable rule;
    empty for an image without captions (what image -> text nDCG needs)."""
    groups = captions_per_image(caption_image, len(image_embeddings))
    has = [i for i, g in enumerate(groups) if len(g)]
    ranked = all_positive_ranks(image_embeddings[has].astype(np.float32, copy=False),
                                caption_embeddings.astype(np.float32, copy=False), [groups[i] for i in has],
                                block_bytes, queries_are_images=True)
    out: list[np.ndarray] = [np.empty(0, np.int64)] * len(groups)
    for i, r in zip(has, ranked, strict=True):
        out[i] = r
    return out


RETRIEVAL_METRIC_FAMILIES = ("recall", "mrr", "ndcg", "rank")


def retrieval_metrics(
    image_embeddings: np.ndarray,
    caption_embeddings: np.ndarray,
    caption_image: np.ndarray,
    recall_k: list[int],
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    *,
    which: tuple[str, ...] = ("recall",),
    i2t_all: list[np.ndarray] | None = None,
) -> dict[str, float]:
    """Metrics of the families in ``which`` (recall, mrr, ndcg, rank) for every k in ``recall_k``; ``i2t_all``: the
    :func:`caption_ranks` of the same data, when the caller has them already."""
    t2i, i2t = retrieval_ranks(image_embeddings, caption_embeddings, caption_image, block_bytes)
    metrics: dict[str, float] = {}
    if "ndcg" in which and i2t_all is None:
        i2t_all = caption_ranks(image_embeddings, caption_embeddings, caption_image, block_bytes)
    for k in recall_k:
        if "recall" in which:
            metrics[f"image_retrieval_recall@{k}"] = recall_from_ranks(t2i, k)
            metrics[f"text_retrieval_recall@{k}"] = recall_from_ranks(i2t, k)
        if "mrr" in which:
            metrics[f"image_retrieval_mrr@{k}"] = mrr_at_k(t2i, k)
            metrics[f"text_retrieval_mrr@{k}"] = mrr_at_k(i2t, k)
        if "ndcg" in which:
            metrics[f"image_retrieval_ndcg@{k}"] = ndcg_at_k([np.array([r]) for r in t2i], k)
            metrics[f"text_retrieval_ndcg@{k}"] = ndcg_at_k(i2t_all or [], k)
    if "rank" in which:
        for direction, ranks in (("image", t2i), ("text", i2t[i2t != NO_POSITIVE])):
            metrics[f"{direction}_retrieval_mean_rank"] = float((ranks + 1).mean()) if len(ranks) else float("nan")
            metrics[f"{direction}_retrieval_median_rank"] = float(np.median(ranks + 1)) if len(ranks) else \
                float("nan")
    return metrics
