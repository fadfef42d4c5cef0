"""Zero-shot image-text retrieval metrics, defined as LAION clip_benchmark defines them, without a dense matrix.

- ``image_retrieval_recall@k`` (text -> image): each caption is a query; a hit if its image is among the top k images.
  Averaged over captions.
- ``text_retrieval_recall@k`` (image -> text): each image is a query; a hit if ANY of its captions is among the top k
  captions. Averaged over images. An image without captions counts as a miss (clip_benchmark divides 0 by 0 there,
  which also never counts as a hit).

Like clip_benchmark this is "CLIP-style" recall: a hit/miss per query, not the fraction of all relevant items found.
``k`` larger than the number of candidates makes every query a hit (clip_benchmark raises instead).
"""

from __future__ import annotations

import numpy as np

from tasks.score.ranking import DEFAULT_BLOCK_BYTES, best_positive_rank

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
        i2t[idx] = best_positive_rank(images[idx], texts, [groups[i] for i in idx], block_bytes)
    return t2i, i2t


def recall_at_k(ranks: np.ndarray, k: int) -> float:
    """Fraction of queries whose best positive rank is below ``k``.

    Computed as float32 hits / float32 count, exactly like clip_benchmark's ``(...).float().mean()``, so the reported
    value is bit-for-bit the one clip_benchmark writes (e.g. 2/17 -> 0.11764705926179886, not 0.11764705882352941).
    """
    if not len(ranks):
        return float("nan")
    return float(np.float32((ranks < k).sum()) / np.float32(len(ranks)))


def retrieval_metrics(
    image_embeddings: np.ndarray,
    caption_embeddings: np.ndarray,
    caption_image: np.ndarray,
    recall_k: list[int],
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> dict[str, float]:
    t2i, i2t = retrieval_ranks(image_embeddings, caption_embeddings, caption_image, block_bytes)
    metrics: dict[str, float] = {}
    for k in recall_k:
        metrics[f"image_retrieval_recall@{k}"] = recall_at_k(t2i, k)
        metrics[f"text_retrieval_recall@{k}"] = recall_at_k(i2t, k)
    return metrics
