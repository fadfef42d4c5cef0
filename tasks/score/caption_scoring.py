"""The captioning task's score step: its captions and references through the metrics of caption_metrics.py, and
CLIPScore / RefCLIPScore from the cache entries; per-image sample rows and 95% intervals.

Sample rows: one unit per metric that defines a per-image value, ``caption_<metric>`` (``caption_cider``,
``caption_bleu_4``, ``caption_clipscore``, ...), each image's value in ``value``, its caption in ``caption`` and its
references in ``reference_captions`` (on every unit's row, so any one unit's rows show what was scored). BLEU and METEOR's corpus values are
not the means of their per-image values (corpus BLEU pools n-gram counts; METEOR's aggregate pools its statistics),
so they get rows but no interval; every other metric is the mean of its rows and gets a percentile-bootstrap
interval over the images (CIDEr's document frequencies held at the full set's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from clipcache.tasks.score.caption_metrics import (
    MEAN_OF_IMAGES,
    clipscore,
    coco_caption_scores,
    ref_similarity,
    refclipscore,
)

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.contract import Encoded
    from clipcache.tasks.score.evidence import Evidence


def score_captions(store: EmbeddingStore, encoded: Encoded, families: Sequence[str], resamples: int,
                   keys: list[str] | None) -> tuple[dict[str, float], Evidence]:
    """The metrics of ``encoded``'s captions against its references, and their evidence (``keys``: the images' own
    names for the sample rows, where the dataset has them)."""
    captions = list(encoded.outcomes["captions"].captions)
    references: list[list[str]] = encoded.info["references"]
    result = coco_caption_scores(references, captions, families)
    metrics, per_image = dict(result.metrics), dict(result.per_image)
    if "clipscore" in families:
        clip_s, ref_clip_s = clip_scores(store, encoded, len(captions), references)
        metrics["clipscore"], metrics["refclipscore"] = float(np.mean(clip_s)), float(np.mean(ref_clip_s))
        per_image["clipscore"], per_image["refclipscore"] = clip_s, ref_clip_s
    return metrics, caption_evidence(per_image, resamples, keys, captions=captions, references=references)


def clip_scores(store: EmbeddingStore, encoded: Encoded, n: int,
                references: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Per image: CLIPScore and RefCLIPScore from the image entry and the prefixed candidate and reference entries."""
    from clipcache.storage.errors import CacheIntegrityError
    from clipcache.tasks.score.cached_rows import image_rows, text_vectors

    image_entry = store.open(encoded.outcomes["image"].ref.key)
    rows = image_rows(image_entry, n)
    if (rows < 0).any():
        raise CacheIntegrityError(f"CLIPScore needs every image's embedding; {int((rows < 0).sum())} images were "
                                  f"skipped as undecodable (cache entry {image_entry.key[:12]})")
    images = image_entry.embeddings()[rows]
    candidates = text_vectors(store.open(encoded.outcomes["candidate"].ref.key), n)
    owner = np.repeat(np.arange(n), [len(r) for r in references])
    refs = text_vectors(store.open(encoded.outcomes["reference"].ref.key), len(owner))
    clip_s = clipscore(images, candidates)
    return clip_s, refclipscore(clip_s, ref_similarity(candidates, refs, owner))


def unit_name(metric: str) -> str:
    return "caption_" + metric.lower()


def caption_evidence(per_image: dict[str, np.ndarray], resamples: int, keys: list[str] | None, *,
                     captions: list[str], references: list[list[str]]) -> Evidence:
    """One part per metric with per-image values (unit ``caption_<metric>``), intervals where the metric is their
    mean; every row carries its image's caption and references."""
    from clipcache.tasks.score.evidence import Evidence
    from clipcache.tasks.score.intervals import interval, mean_statistic

    n = len(captions)
    index = np.arange(n, dtype=np.int64)
    texts = {"caption": list(captions), "reference_captions": [list(r) for r in references]}
    parts = []
    for metric, values in per_image.items():
        part = Evidence(unit_name(metric), {"sample_index": index, "value": np.asarray(values, np.float64), **texts},
                        keys)
        if resamples > 0 and n and metric in MEAN_OF_IMAGES:
            part.intervals[metric] = interval(mean_statistic(part.columns["value"]), n, resamples=resamples)
        parts.append(part)
    if not parts:
        return Evidence("caption", {"sample_index": index, **texts}, keys)
    first, *more = parts
    first.more = more
    return first
