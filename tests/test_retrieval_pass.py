"""The torch score pass: recall@k equal to clip_benchmark's own recall_at_k on the dense matrix, ties included,
for any tile size; tie-sensitive queries counted; the stable rule equal to brute-force ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clip_benchmark.metrics.zeroshot_retrieval import batchify
from clip_benchmark.metrics.zeroshot_retrieval import recall_at_k as cb_recall_at_k

from clipcache.tasks.score import retrieval_pass
from clipcache.tasks.score.retrieval import recall_at_k, retrieval_ranks
from clipcache.tasks.score.retrieval_pass import EPS, recall_counts

CPU = torch.device("cpu")
# The GPU path runs wherever a GPU is (the device machine); the suite must pass without one.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def tied_data(seed: int, n_images: int = 60, dim: int = 16, copies: int = 3):
    """Images and captions with exact duplicates (repeated caption texts, identical images) and coarse values, so
    that many queries tie across the cut-off, as COCO / Flickr captions and templated sets do."""
    rng = np.random.default_rng(seed)
    base = unit(np.round(rng.normal(size=(n_images // copies, dim)), 0) + 0.01)
    images = np.concatenate([base] * copies)[rng.permutation(n_images)]
    texts = unit(np.round(rng.normal(size=(n_images // 2, dim)), 0) + 0.01)
    caption_image = np.concatenate([np.arange(n_images), rng.integers(0, n_images, size=n_images)])
    captions = texts[rng.integers(0, len(texts), size=len(caption_image))]  # every text several times
    return images, captions, caption_image


def clip_benchmark_recall(images, captions, caption_image, k, device="cpu", batch_size=64):
    """clip_benchmark's computation: the dense matrix on the CPU, topk per row in batches on its device, any
    positive kept -> hit."""
    scores = torch.from_numpy(captions) @ torch.from_numpy(images).T
    positives = torch.zeros_like(scores, dtype=torch.bool)
    positives[torch.arange(len(scores)), torch.from_numpy(caption_image)] = True
    t2i = (batchify(cb_recall_at_k, scores, positives, batch_size, device, k=k) > 0).float().mean().item()
    i2t = (batchify(cb_recall_at_k, scores.T, positives.T, batch_size, device, k=k) > 0).float().mean().item()
    return t2i, i2t


def ours(images, captions, caption_image, ks, budget, rule="topk", device="cpu"):
    d = torch.device(device)
    return recall_counts(torch.from_numpy(captions).to(d), torch.from_numpy(images).to(d),
                         torch.from_numpy(caption_image).to(d), ks, budget, rule=rule, topk_device=d)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [4 * 16 * 16, 4 * 40 * 70, 1 << 26])  # many tiles, a few, one
def test_topk_rule_equals_clip_benchmark_with_ties_for_any_tile_size(seed, budget, device):
    images, captions, caption_image = tied_data(seed)
    ks = [1, 2, 5, 10]
    t2i, i2t = ours(images, captions, caption_image, ks, budget, device=device)
    assert t2i.decided_exactly > 0 and i2t.decided_exactly > 0  # the data has ties that need topk's choice
    for k in ks:
        ref_t2i, ref_i2t = clip_benchmark_recall(images, captions, caption_image, k, device)
        assert recall_at_k(t2i.hits[k], t2i.queries) == ref_t2i, ("t2i", k)
        assert recall_at_k(i2t.hits[k], i2t.queries) == ref_i2t, ("i2t", k)
    assert sum(t2i.tied.values()) > 0 and sum(i2t.tied.values()) > 0


def test_tie_sensitive_queries_are_counted_exactly():
    # image 0 and 1 are identical: caption 0 (of image 0) scores both equally at the top
    images = unit(np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32))
    captions = unit(np.array([[1, 0.1, 0], [0, 1, 0.1], [0.1, 0, 1]], dtype=np.float32))
    caption_image = np.array([0, 2, 3])
    t2i, _ = ours(images, captions, caption_image, [1, 2], 1 << 20)
    assert t2i.tied == {1: 1, 2: 0}  # at k=1 the tie straddles the cut-off; at k=2 both tied images are kept
    assert t2i.hits[2] == 3
    ref = clip_benchmark_recall(images, captions, caption_image, 1)[0]
    assert recall_at_k(t2i.hits[1], 3) == ref


@pytest.mark.parametrize("seed", range(3))
def test_stable_rule_equals_brute_force_ranks(seed):
    images, captions, caption_image = tied_data(seed)
    ks = [1, 3, 7]
    t2i, i2t = ours(images, captions, caption_image, ks, 4 * 20 * 20, rule="stable")
    ranks_t2i, ranks_i2t = retrieval_ranks(images, captions, caption_image)
    for k in ks:
        assert t2i.hits[k] == int((ranks_t2i < k).sum())
        assert i2t.hits[k] == int((ranks_i2t < k).sum())


def test_k_larger_than_candidates_one_query_and_an_image_without_captions():
    images = unit(np.eye(4, dtype=np.float32)[:3])
    captions = unit(np.array([[1, 0.2, 0, 0]], dtype=np.float32))
    t2i, i2t = ours(images, captions, np.array([1]), [1, 2, 50], 1 << 20)
    assert (t2i.queries, i2t.queries) == (1, 3)
    assert t2i.hits == {1: 0, 2: 1, 50: 1}
    # image->text: only image 1 has a caption; images 0 and 2 are misses at every k
    assert i2t.hits[50] == 1 and i2t.hits[1] == 1


@pytest.mark.parametrize("device", DEVICES)
def test_near_ties_from_other_kernels_are_decided_exactly(device):
    """Scores within EPS of the cut-off are recomputed as clip_benchmark computes them, not trusted to a kernel."""
    rng = np.random.default_rng(7)
    images = unit(rng.normal(size=(200, 32)))
    captions = unit(images[rng.integers(0, 200, size=300)] + rng.normal(scale=1e-7, size=(300, 32)))
    caption_image = rng.integers(0, 200, size=300)
    t2i, i2t = ours(images, captions, caption_image, [1, 5], 1 << 22, device=device)
    for k in (1, 5):
        ref = clip_benchmark_recall(images, captions, caption_image, k, device)
        assert (recall_at_k(t2i.hits[k], 300), recall_at_k(i2t.hits[k], 200)) == ref
    reference = (torch.from_numpy(captions) @ torch.from_numpy(images).T).numpy()
    kernel = (torch.from_numpy(captions).to(device) @ torch.from_numpy(images).to(device).T).cpu().numpy()
    assert EPS > 10 * max(np.abs(captions @ images.T - reference).max(), np.abs(kernel - reference).max())


@pytest.mark.parametrize("shape,k", [((5000, 37), 11), ((600, 90), 1), ((130, 7), 10), ((4096, 3), 5)])
def test_column_top_values_equal_plain_topk(shape, k):
    from clipcache.tasks.score.retrieval_pass import top_values_per_column

    x = torch.from_numpy(np.round(np.random.default_rng(0).normal(size=shape), 2).astype(np.float32))  # with ties
    expected = torch.topk(x, min(k, shape[0]), dim=0).values
    assert torch.equal(torch.sort(top_values_per_column(x, k), dim=0, descending=True).values, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_exact_rows_computed_in_blocks_give_the_full_products_choice(monkeypatch, device):
    """Large sets are never multiplied in one piece: exact rows come from blocks of >= 16 queries x >= 16
    candidates, and still reproduce clip_benchmark's choice."""
    from clipcache.tasks.score import retrieval_pass

    monkeypatch.setattr(retrieval_pass, "SMALL_MATRIX", 0)
    monkeypatch.setattr(retrieval_pass.ExactScores, "CANDIDATE_BLOCK", 40)
    images, captions, caption_image = tied_data(5, n_images=90)
    t2i, i2t = ours(images, captions, caption_image, [1, 3, 10], 4 * 32 * 32, device=device)
    assert t2i.decided_exactly and i2t.decided_exactly
    for k in (1, 3, 10):
        ref = clip_benchmark_recall(images, captions, caption_image, k, device)
        assert (recall_at_k(t2i.hits[k], t2i.queries), recall_at_k(i2t.hits[k], i2t.queries)) == ref


@pytest.mark.parametrize("width", [16, 23])
@pytest.mark.parametrize("rule", ["topk", "stable"])
def test_several_image_tiles_per_row_give_the_same_counts(width, rule, monkeypatch):
    """Real data has more images than one tile holds (TILE_WIDTH): narrow tiles exercise the running top-k merge
    across image tiles in both directions."""
    images, captions, caption_image = tied_data(5, n_images=90)
    ks = [1, 3, 10]
    wide_t2i, wide_i2t = ours(images, captions, caption_image, ks, 1 << 26, rule=rule)
    monkeypatch.setattr(retrieval_pass, "TILE_WIDTH", width)
    t2i, i2t = ours(images, captions, caption_image, ks, 4 * 20 * width, rule=rule)
    assert (t2i.hits, t2i.tied, i2t.hits, i2t.tied) == (wide_t2i.hits, wide_t2i.tied, wide_i2t.hits, wide_i2t.tied)
    if rule == "topk":
        for k in ks:
            ref_t2i, ref_i2t = clip_benchmark_recall(images, captions, caption_image, k)
            assert (recall_at_k(t2i.hits[k], t2i.queries), recall_at_k(i2t.hits[k], i2t.queries)) == (ref_t2i, ref_i2t)


@pytest.mark.parametrize("rule", ["topk", "stable"])
def test_exact_row_decisions_equal_a_per_row_brute_force(rule):
    """The decisions on exact rows, made for a block of queries at once: per row and k, a hit when topk keeps a
    positive (topk) or the best positive's stable rank is below k (stable); tie-sensitive when a positive ties with
    the k-th score and the tie straddles the cut-off. Coarse scores (many ties), several positives per row, a row
    without a positive, k up to the row's width, and a block of one row."""
    from clipcache.tasks.score.ranking import decide_rows

    rng = np.random.default_rng(5)
    rows = torch.from_numpy(np.round(rng.normal(size=(40, 12)), 0).astype(np.float32))
    positive = rng.random((40, 12)) < 0.2
    positive[0] = False
    for k in range(1, 13):
        for block in (slice(None), slice(7, 8)):
            hits, tied = decide_rows(rows[block].contiguous(), positive[block], k, rule, CPU)
            for i, row in enumerate(rows[block]):
                own = np.flatnonzero(positive[block][i])
                kth = torch.topk(row, k).values[-1]
                straddles = int((row >= kth).sum()) > k
                assert tied[i] == (bool((row[own] == kth).any()) and straddles), (k, i)
                if rule == "topk":
                    assert hits[i] == bool(np.isin(own, torch.topk(row, k).indices.numpy()).any()), (k, i)
                else:
                    order = np.lexsort((np.arange(12), -row.numpy()))  # descending score, then lower index
                    assert hits[i] == bool(np.isin(order[:k], own).any()), (k, i)
