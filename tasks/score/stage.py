"""Score stage: cache entries -> metrics, in torch on the scoring device. Reads arrays only; never loads a model or
decodes an image. Every entry is checked against what the dataset expects before anything is scored."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clipcache.storage.cache_entry import EmbeddingEntry
from clipcache.storage.cache_keys import EmbeddingRef, cache_command
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.text_pool import TextPool
from clipcache.tasks.contract import ScoreSettings, Ties
from clipcache.tasks.score.classification import (
    ClassificationCounts,
    average_precision_per_class,
    logit_batches,
    zero_shot_classifier,
)
from clipcache.tasks.score.device import load_rows, tile_bytes, torch_device
from clipcache.tasks.score.retrieval import caption_ranks, recall_at_k, retrieval_metrics
from clipcache.tasks.score.retrieval_evidence import RetrievalQueries
from clipcache.tasks.score.retrieval_pass import query_outcomes, recall_counts


def with_skipped_images(metrics: dict[str, float], image_entry: EmbeddingEntry) -> dict[str, float]:
    """Images left out as undecodable (only with --on_bad_image skip) are a metric of their own, so the numbers are
    read with that in mind."""
    skipped = int(image_entry.meta.get("n_samples", image_entry.count)) - image_entry.count
    return {**metrics, "skipped_images": float(skipped)} if skipped else metrics


def _expect(condition: bool, entry: EmbeddingEntry, what: str) -> None:
    if not condition:
        raise CacheIntegrityError(f"cache entry {entry.key} does not fit this evaluation: {what} ({entry.path}); "
                                  f"delete it with `{entry.remedy('rm')}` and run the evaluation again")


def check_images(entry: EmbeddingEntry, n_samples: int | None) -> None:
    if n_samples is not None:
        expected = int(entry.meta.get("n_samples", entry.count))
        _expect(expected == n_samples and entry.count <= n_samples, entry,
                f"it holds {entry.count} image rows of {expected} samples, the dataset has {n_samples}")


def score_classification(store: EmbeddingStore, images: EmbeddingRef, prompts: Any, *, n_classes: int,
                         n_templates: int, settings: ScoreSettings, n_samples: int | None = None,
                         keep_samples: bool = False) -> tuple[dict[str, float], int, dict[str, np.ndarray] | None]:
    """Metrics, images scored and, with ``keep_samples``, each image's outcome (``sample_index``: its position in
    the dataset; images skipped as undecodable have no row). Multilabel: each class's ``average_precision``, with
    the ``logits`` and ``multi_hot`` targets it was computed from (what an interval over the images resamples)."""
    device = torch_device(settings.device)
    image_entry = store.open(images.key)
    check_images(image_entry, n_samples)
    if len(prompts.lookup.batch) != n_classes * n_templates:
        raise CacheIntegrityError(f"{len(prompts.lookup.batch)} prompt vectors for {n_classes} classes x "
                                  f"{n_templates} templates")
    prompt_vectors = TextPool(store, prompts.pool).gather(prompts.lookup)
    if not np.isfinite(prompt_vectors).all():
        rows = ~np.isfinite(prompt_vectors).all(axis=1)
        bad = [prompts.lookup.batch_keys[b] for b in np.unique(prompts.lookup.batch[rows])]
        raise CacheIntegrityError(f"cache entry {bad[0]} holds a non-finite class prompt embedding; delete it with "
                                  f"`{cache_command(store.root, 'verify --delete', bad[0])}` and run the evaluation again")
    if prompt_vectors.shape[1] != image_entry.dim:  # either side may be the stale one: name both
        prompt_key = prompts.lookup.batch_keys[0]
        raise CacheIntegrityError(
            f"cache entries do not fit together: image entry {image_entry.key} has {image_entry.dim} dimensions, "
            f"class prompt entry {prompt_key} has {prompt_vectors.shape[1]}; delete both with "
            f"`{cache_command(store.root, 'rm', image_entry.key, prompt_key)}` and run the evaluation again")
    classifier = zero_shot_classifier(prompt_vectors, n_classes, n_templates, device)
    targets = torch.from_numpy(image_entry.array("target"))
    image_rows = load_rows(image_entry, device)
    batches = logit_batches(image_rows, classifier, settings.batch_size)
    samples = None
    positions = np.asarray(image_entry.array("position"), np.int64)
    if targets.ndim == 2:  # multilabel: average precision needs every sample's logits per class
        scores = torch.cat(list(batches))
        average_precision = average_precision_per_class(scores, targets)
        metrics = {"mean_average_precision": float(average_precision.mean())}  # float32 mean, as clip_benchmark's
        if keep_samples:
            samples = {"average_precision": average_precision.numpy().astype(np.float64), "logits": scores.numpy(),
                       "multi_hot": targets.numpy(), "sample_index": positions}
    else:
        counts = ClassificationCounts(n_classes, keep_samples=keep_samples)
        for lo, batch in zip(range(0, len(targets), settings.batch_size), batches, strict=True):
            counts.add(batch, targets[lo : lo + len(batch)].long())
        metrics = counts.metrics()
        if keep_samples:
            samples = {**counts.samples(), "sample_index": positions}
    return with_skipped_images(metrics, image_entry), len(targets), samples


def caption_targets(store: EmbeddingStore, images: EmbeddingRef, captions: EmbeddingRef
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """(row of each caption in the caption entry, image row of each caption, image count): captions of images
    skipped as undecodable are dropped with them."""
    _, caption_row, caption_image, n_images = caption_map(store, images, captions)
    return caption_row, caption_image, n_images


def caption_map(store: EmbeddingStore, images: EmbeddingRef, captions: EmbeddingRef
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`caption_targets` with, first, each kept caption's position in the dataset's caption order."""
    image_positions = store.open(images.key).array("position")  # dataset sample index of each image row
    entry = store.open(captions.key)
    caption_row, caption_sample = entry.array("caption_row"), entry.array("caption_sample")
    _expect(len(caption_row) == 0 or int(caption_row.max()) < entry.count, entry,
            "its caption map points past its rows")
    row_of_sample = np.full(int(max(image_positions.max(initial=-1), caption_sample.max(initial=-1))) + 1, -1,
                            dtype=np.int64)
    row_of_sample[image_positions] = np.arange(len(image_positions))
    caption_image = row_of_sample[caption_sample]
    keep = caption_image >= 0
    return np.flatnonzero(keep), caption_row[keep], caption_image[keep], len(image_positions)


def score_retrieval(store: EmbeddingStore, images: EmbeddingRef, captions: EmbeddingRef, settings: ScoreSettings,
                    n_samples: int | None = None, *, ties: Ties, keep_samples: bool = False
                    ) -> tuple[dict[str, float], int, dict[str, int], RetrievalQueries | None]:
    """recall@k both ways (``ties``: clip_benchmark's topk choice, or the stable rule), and the other metric
    families asked for; returns (metrics, images, tie-sensitive queries per recall metric, and with
    ``keep_samples`` every query's outcome, found in the same pass)."""
    device = torch_device(settings.device)
    image_entry, caption_entry = store.open(images.key), store.open(captions.key)
    check_images(image_entry, n_samples)
    _expect(caption_entry.dim == image_entry.dim, caption_entry,
            f"its embeddings have {caption_entry.dim} dimensions, the images {image_entry.dim}")
    caption_position, caption_row, caption_image, n_images = caption_map(store, images, captions)
    host = None
    if device.type != "cpu":  # exact rows are computed on the CPU, as clip_benchmark computes its matrix
        host = (torch.empty((len(caption_row), caption_entry.dim)), torch.empty((image_entry.count, image_entry.dim)))
    image_rows = load_rows(image_entry, device, host=host[1] if host else None)
    caption_rows = load_rows(caption_entry, device, caption_row, host=host[0] if host else None)
    owner = torch.from_numpy(caption_image).to(device)
    ks = list(settings.recall_k)
    queries = None
    if keep_samples:
        text, image = query_outcomes(caption_rows, image_rows, owner, ks, tile_bytes(device), rule=ties,
                                     topk_device=device, host=host)
        t2i, i2t = text.counts(ks), image.counts(ks)
        queries = RetrievalQueries(text, image, ks, caption_position,
                                   np.asarray(image_entry.array("position"), np.int64))
    else:
        t2i, i2t = recall_counts(caption_rows, image_rows, owner, ks, tile_bytes(device), rule=ties,
                                 topk_device=device, host=host)
    metrics: dict[str, float] = {}
    tied: dict[str, int] = {}
    if "recall" in settings.retrieval_metrics:
        for k in settings.recall_k:
            for name, counts in (("image", t2i), ("text", i2t)):
                flat = f"{name}_retrieval_recall@{k}"
                metrics[flat] = recall_at_k(counts.hits[k], counts.queries)
                tied[flat] = counts.tied.get(k, 0)
    others = tuple(f for f in settings.retrieval_metrics if f != "recall")
    if others:  # ranks-based families use the stable rule (documented): exact ranks, no topk involved
        image_array, caption_array = image_rows.cpu().numpy(), caption_rows.cpu().numpy()
        every_caption = None
        if queries is not None and "ndcg" in others:  # image -> text nDCG's rows: every caption's rank
            every_caption = queries.caption_ranks = caption_ranks(image_array, caption_array, caption_image)
        ranked = retrieval_metrics(image_array, caption_array, caption_image, list(settings.recall_k), which=others,
                                   i2t_all=every_caption)
        metrics.update(ranked)
    return with_skipped_images(metrics, image_entry), n_images, tied, queries


def score_selection(store: EmbeddingStore, images: EmbeddingRef, captions: EmbeddingRef, item_images: np.ndarray,
                    n_images: int, *, keep_samples: bool = False, targets: tuple[int, ...] | None = None,
                    strict: bool = False) -> tuple[dict[str, float], int, dict[str, int], dict[str, np.ndarray] | None]:
    """Image-caption selection over the cache: items whose images were all encoded (an image skipped as
    undecodable drops its items, counted in ``skipped_images``); (metrics, items scored, tie-sensitive items and,
    with ``keep_samples``, each scored item's outcomes with its ``sample_index``, the item's position); ``targets``
    (each image's caption index) and ``strict`` (a tie is a miss) as in
    :func:`~clipcache.tasks.score.selection.selection_outcomes`."""
    from clipcache.tasks.score.selection import selection_metrics, selection_outcomes

    image_entry, caption_entry = store.open(images.key), store.open(captions.key)
    check_images(image_entry, n_images)
    _expect(caption_entry.dim == image_entry.dim, caption_entry,
            f"its embeddings have {caption_entry.dim} dimensions, the images {image_entry.dim}")
    caption_row, caption_item = caption_entry.array("caption_row"), caption_entry.array("caption_sample")
    n_items, per_item = item_images.shape
    n_captions = np.bincount(caption_item, minlength=n_items)
    _expect(len(caption_row) > 0 and (n_captions == n_captions[0]).all() and len(n_captions) == n_items, caption_entry,
            f"its caption map does not give each of the {n_items} items the same number of captions")
    row_of_image = np.full(n_images, -1, dtype=np.int64)
    row_of_image[image_entry.array("position")] = np.arange(image_entry.count)
    image_rows = row_of_image[item_images]
    keep = (image_rows >= 0).all(axis=1)
    image_vectors = load_rows(image_entry, torch.device("cpu"))[torch.from_numpy(image_rows[keep].reshape(-1))]
    order = np.argsort(caption_item, kind="stable")  # captions item by item, in their order within the item
    text_vectors = load_rows(caption_entry, torch.device("cpu"), caption_row[order])
    text_vectors = text_vectors.view(n_items, int(n_captions[0]), -1)[torch.from_numpy(keep)]
    outcomes = selection_outcomes(image_vectors.view(int(keep.sum()), per_item, -1), text_vectors,
                                  targets=targets, strict=strict)
    metrics, tied = selection_metrics(outcomes)
    samples = {**outcomes, "sample_index": np.flatnonzero(keep)} if keep_samples else None
    return with_skipped_images(metrics, image_entry), int(keep.sum()), {"acc": tied}, samples
