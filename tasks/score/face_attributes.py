"""FairFace / UTKFace scoring: each cached face embedding through several zero-shot heads at once (DataComp's
``evaluate_fairface_dataset``): one clip_benchmark classifier per objective (the L2-normalised mean of its
templates' embeddings per class), logits ``100 * image @ W`` and the argmax within the head's own classes. DataComp
pads the heads to one tensor and masks the padding to -1e9, which is the same argmax. Reads arrays only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from clipcache.storage.cache_keys import EmbeddingRef
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.text_pool import TextPool
from clipcache.tasks.contract import ScoreSettings
from clipcache.tasks.score.classification import logit_batches, zero_shot_classifier
from clipcache.tasks.score.device import load_rows, torch_device
from clipcache.tasks.score.stage import check_images


@dataclass(frozen=True)
class HeadShape:
    objective: str
    n_classes: int
    n_templates: int

    @property
    def rows(self) -> int:
        return self.n_classes * self.n_templates


def head_predictions(store: EmbeddingStore, images: EmbeddingRef, prompts: Any, heads: list[HeadShape], *,
                     settings: ScoreSettings, n_samples: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(each scored image's position in the dataset, objective -> its head's argmax per image). ``prompts``: the
    heads' class-major prompt vectors one head after another, in ``heads``' order (a PromptOutcome)."""
    device = torch_device(settings.device)
    image_entry = store.open(images.key)
    check_images(image_entry, n_samples)
    expected = sum(h.rows for h in heads)
    if len(prompts.lookup.batch) != expected:
        raise CacheIntegrityError(f"{len(prompts.lookup.batch)} prompt vectors for {len(heads)} heads of "
                                  f"{expected} prompts")
    vectors = TextPool(store, prompts.pool).gather(prompts.lookup)
    if not np.isfinite(vectors).all() or vectors.shape[1] != image_entry.dim:
        raise CacheIntegrityError(f"the class prompt vectors ({vectors.shape[1]} dimensions) do not fit image entry "
                                  f"{image_entry.key} ({image_entry.dim}) or are not finite; delete the entries "
                                  f"with `clipcache cache rm` and run the evaluation again")
    rows = load_rows(image_entry, device)
    predictions: dict[str, np.ndarray] = {}
    offset = 0
    for head in heads:
        classifier = zero_shot_classifier(vectors[offset : offset + head.rows], head.n_classes, head.n_templates,
                                          device)
        offset += head.rows
        # torch's argmax takes the first of tied maxima, as DataComp's does
        parts = [batch.argmax(dim=1) for batch in logit_batches(rows, classifier, settings.batch_size)]
        predictions[head.objective] = (torch.cat(parts).numpy().astype(np.int64) if parts
                                       else np.zeros(0, np.int64))
    return np.asarray(image_entry.array("position"), np.int64), predictions
