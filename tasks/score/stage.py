"""Score stage: cache entries -> metrics. Reads arrays only; never loads a model or decodes an image."""

from __future__ import annotations

import numpy as np

from clipcache.storage.cache_keys import EmbeddingRef
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.text_pool import TextPool
from clipcache.tasks.evaluation.base import ScoreSettings
from clipcache.tasks.score.classification import classification_metrics, logits, zero_shot_classifier
from clipcache.tasks.score.retrieval import retrieval_metrics


def with_skipped_images(metrics: dict[str, float], image_entry) -> dict[str, float]:
    """Images left out as undecodable (only with --on_bad_image skip) are a metric of their own, so the numbers are
    read with that in mind."""
    skipped = int(image_entry.meta.get("n_samples", image_entry.count)) - image_entry.count
    return {**metrics, "skipped_images": float(skipped)} if skipped else metrics


def score_classification(store: EmbeddingStore, images: EmbeddingRef, prompts, n_classes: int, n_templates: int,
                         settings: ScoreSettings) -> tuple[dict[str, float], int]:
    image_entry = store.open(images.key)
    if len(prompts.lookup.batch) != n_classes * n_templates:
        raise CacheIntegrityError(f"{len(prompts.lookup.batch)} prompt vectors for {n_classes} classes x "
                                  f"{n_templates} templates")
    classifier = zero_shot_classifier(TextPool(store, prompts.pool).gather(prompts.lookup), n_classes, n_templates)
    targets = image_entry.array("target")
    metrics = classification_metrics(logits(image_entry.embeddings(), classifier), targets, n_classes)
    return with_skipped_images(metrics, image_entry), len(targets)


def caption_targets(store: EmbeddingStore, images: EmbeddingRef, captions: EmbeddingRef
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """(row of each caption in the caption entry, image row of each caption, image count): captions of images
    skipped as undecodable are dropped with them."""
    image_positions = store.open(images.key).array("position")  # dataset sample index of each image row
    entry = store.open(captions.key)
    caption_row, caption_sample = entry.array("caption_row"), entry.array("caption_sample")
    row_of_sample = np.full(int(max(image_positions.max(initial=-1), caption_sample.max(initial=-1))) + 1, -1,
                            dtype=np.int64)
    row_of_sample[image_positions] = np.arange(len(image_positions))
    caption_image = row_of_sample[caption_sample]
    keep = caption_image >= 0
    return caption_row[keep], caption_image[keep], len(image_positions)


def score_retrieval(store: EmbeddingStore, images: EmbeddingRef, captions: EmbeddingRef, settings: ScoreSettings
                    ) -> tuple[dict[str, float], int, dict[str, int]]:
    caption_row, caption_image, n_images = caption_targets(store, images, captions)
    caption_embeddings = store.open(captions.key).embeddings()[caption_row]
    image_entry = store.open(images.key)
    metrics = retrieval_metrics(image_entry.embeddings(), caption_embeddings, caption_image,
                                list(settings.recall_k), which=settings.retrieval_metrics)
    return with_skipped_images(metrics, image_entry), n_images, {}
