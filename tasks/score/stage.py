"""Score stage: cache entries -> metrics. Reads arrays only; never loads a model or decodes an image."""

from __future__ import annotations

import numpy as np

from clipcache.storage.embedding_store import EmbeddingRef, EmbeddingStore
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.text_pool import PoolLookup, TextPool
from clipcache.tasks.score.classification import classification_metrics, logits, zero_shot_classifier
from clipcache.tasks.score.retrieval import retrieval_metrics


def score_classification(store: EmbeddingStore, images: EmbeddingRef, pool: str, prompts: PoolLookup,
                         n_classes: int, n_templates: int) -> tuple[dict[str, float], int]:
    image_entry = store.open(images.key)
    if len(prompts.batch) != n_classes * n_templates:
        raise CacheIntegrityError(f"{len(prompts.batch)} prompt vectors for {n_classes} classes x {n_templates} "
                                  f"templates")
    classifier = zero_shot_classifier(TextPool(store, pool).gather(prompts), n_classes, n_templates)
    targets = image_entry.array("target")
    return classification_metrics(logits(image_entry.embeddings(), classifier), targets, n_classes), len(targets)


def score_retrieval(store: EmbeddingStore, images: EmbeddingRef, captions: EmbeddingRef, recall_k: list[int],
                    which: tuple[str, ...] = ("recall",)) -> tuple[dict[str, float], int]:
    image_entry = store.open(images.key)
    caption_entry = store.open(captions.key)
    image_positions = image_entry.array("position")  # dataset sample index of each image row
    caption_sample = caption_entry.array("sample_index")
    # Map dataset sample index -> image row; captions of images skipped as undecodable are dropped with them.
    row_of_sample = np.full(int(max(image_positions.max(initial=-1), caption_sample.max(initial=-1))) + 1, -1,
                            dtype=np.int64)
    row_of_sample[image_positions] = np.arange(len(image_positions))
    caption_image = row_of_sample[caption_sample]
    keep = caption_image >= 0
    caption_embeddings = caption_entry.embeddings()
    if not keep.all():
        caption_embeddings, caption_image = caption_embeddings[keep], caption_image[keep]
    metrics = retrieval_metrics(image_entry.embeddings(), caption_embeddings, caption_image, recall_k, which=which)
    return metrics, len(image_positions)
