"""Retrieval metrics: hand-computed cases (several captions per image, ties, k > n, one query), bounded-memory
blocks down to one row, and LAION clip_benchmark's dense implementation as the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clip_benchmark.metrics.zeroshot_retrieval import recall_at_k as cb_recall_at_k

from clipcache.tasks.score.ranking import best_positive_rank, rank_of_positive_in_row
from clipcache.tasks.score.retrieval import retrieval_metrics, retrieval_ranks


def normed(rng, n, d=16):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def clip_benchmark_reference(images, texts, caption_image, ks):
    """clip_benchmark's own dense computation (zeroshot_retrieval.evaluate, minus the model)."""
    scores = torch.from_numpy(texts) @ torch.from_numpy(images).t()
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(scores)), torch.from_numpy(caption_image)] = True
    out = {}
    for k in ks:
        out[f"image_retrieval_recall@{k}"] = (cb_recall_at_k(scores, positive, k) > 0).float().mean().item()
        out[f"text_retrieval_recall@{k}"] = (cb_recall_at_k(scores.T, positive.T, k) > 0).float().mean().item()
    return out


def test_hand_computed_with_several_captions_per_image():
    # 2-d unit vectors: images at angles 0, 90, 180 degrees
    images = np.array([[1, 0], [0, 1], [-1, 0]], dtype=np.float32)
    texts = np.array([
        [1, 0],           # caption of image 0, nearest image 0 -> rank 0
        [0.6, 0.8],       # caption of image 0, nearest image 1 (0.8) then 0 (0.6) -> rank 1
        [-0.8, 0.6],      # caption of image 1: scores (-0.8, 0.6, 0.8) -> image 1 rank 1
        [0, -1],          # caption of image 2: scores (0, -1, 0) -> image 2 tied with image 0, higher index -> rank 1
    ], dtype=np.float32)
    caption_image = np.array([0, 0, 1, 2])
    t2i, i2t = retrieval_ranks(images, texts, caption_image)
    assert t2i.tolist() == [0, 1, 1, 1]
    # image 0: captions 0 (score 1, rank 0) and 1 -> best 0; image 1: its caption 2 scores 0.6, captions 1 (0.8)
    # ranks above -> rank 1; image 2: caption 3 scores 0, captions 2 (0.8) above, caption 0 (-1) and 1 (-0.6) below -> 1
    assert i2t.tolist() == [0, 1, 1]
    m = retrieval_metrics(images, texts, caption_image, [1, 2])
    assert m["image_retrieval_recall@1"] == 0.25 and m["image_retrieval_recall@2"] == 1.0
    assert m["text_retrieval_recall@1"] == pytest.approx(1 / 3) and m["text_retrieval_recall@2"] == 1.0


def test_k_larger_than_candidates_is_a_hit():
    rng = np.random.default_rng(1)
    images, texts = normed(rng, 3), normed(rng, 5)
    m = retrieval_metrics(images, texts, np.array([0, 1, 2, 0, 1]), [50])
    assert m == {"image_retrieval_recall@50": 1.0, "text_retrieval_recall@50": 1.0}


def test_one_query_each_way():
    images = np.array([[1.0, 0.0]], dtype=np.float32)
    texts = np.array([[0.0, 1.0]], dtype=np.float32)
    assert retrieval_metrics(images, texts, np.array([0]), [1]) == {"image_retrieval_recall@1": 1.0,
                                                                  "text_retrieval_recall@1": 1.0}


def test_exact_ties_follow_the_documented_rule():
    scores = np.array([[0.5, 0.5, 0.5, 0.2]], dtype=np.float32)
    assert rank_of_positive_in_row(scores, np.array([0])).tolist() == [0]
    assert rank_of_positive_in_row(scores, np.array([2])).tolist() == [2]
    assert rank_of_positive_in_row(scores, np.array([3])).tolist() == [3]


def test_image_without_caption_is_a_miss():
    images = np.eye(3, dtype=np.float32)
    texts = np.eye(3, dtype=np.float32)[:2]
    m = retrieval_metrics(images, texts, np.array([0, 1]), [5])
    assert m["text_retrieval_recall@5"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("block_bytes", [1, 64, 4096, 1 << 28])
@pytest.mark.parametrize("seed", range(3))
def test_blocks_of_any_size_match_clip_benchmark(seed, block_bytes):
    rng = np.random.default_rng(seed)
    n_images = int(rng.integers(5, 60))
    caption_image = np.concatenate([np.arange(n_images), rng.integers(0, n_images, size=n_images * 2)])
    rng.shuffle(caption_image)
    images, texts = normed(rng, n_images), normed(rng, len(caption_image))
    ks = [1, 3, 5, 10]
    ours = retrieval_metrics(images, texts, caption_image, ks, block_bytes=block_bytes)
    assert ours == clip_benchmark_reference(images, texts, caption_image, ks)


def test_best_rank_brute_force_with_ties_from_quantised_vectors():
    rng = np.random.default_rng(7)
    # Quantising to a coarse grid produces many exactly equal scores.
    queries = np.round(rng.normal(size=(40, 4)) * 2).astype(np.float32)
    cands = np.round(rng.normal(size=(25, 4)) * 2).astype(np.float32)
    positives = [rng.choice(25, size=int(rng.integers(1, 4)), replace=False) for _ in range(40)]
    got = best_positive_rank(queries, cands, positives, block_bytes=1)
    scores = queries @ cands.T
    for q in range(40):
        order = sorted(range(25), key=lambda j: (-scores[q, j], j))  # stable: score desc, index asc
        assert got[q] == min(order.index(p) for p in positives[q])
