"""One (model, dataset) evaluation as plain functions: choose the task, encode what is missing, score from the cache."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from clipcache.storage.embedding_store import EmbeddingStore, entry_key
from clipcache.storage.errors import ClipcacheError, DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import EvalDataset, Task
from clipcache.tasks.encode.stage import (
    EncodeOutcome,
    ModelSession,
    PromptOutcome,
    caption_key_fields,
    encode_images,
    encode_prompts,
    encode_texts,
    image_key_fields,
)
from clipcache.tasks.progress import StageProgress
from clipcache.tasks.score.stage import score_classification, score_retrieval


class CacheMissError(ClipcacheError):
    """``rescore`` needs embeddings that are not in the cache."""

    def __init__(self, missing: list[str]):
        self.missing = missing
        super().__init__("not in the cache: " + "; ".join(missing))


@dataclass(frozen=True)
class EncodeOptions:
    batch_size: int = 64
    num_workers: int = 2
    on_bad_image: str = "error"
    limit: int | None = None
    cached_only: bool = False  # rescore: images and captions must come from the cache


@dataclass
class EncodedDataset:
    """References to the cache entries one evaluation needs (small; no arrays)."""

    task: Task
    images: EncodeOutcome
    captions: EncodeOutcome | None = None
    prompts: PromptOutcome | None = None
    n_classes: int = 0
    n_templates: int = 0
    seconds: float = 0.0

    @property
    def cache_hit(self) -> bool:
        texts_hit = self.captions.cache_hit if self.captions else self.prompts.cache_hit
        return self.images.cache_hit and texts_hit

    @property
    def resumed(self) -> bool:
        return self.images.resumed or bool(self.captions and self.captions.resumed)

    @property
    def cache_keys(self) -> list[str]:
        texts = [self.captions.ref.key] if self.captions else list(self.prompts.lookup.batch_keys)
        return [self.images.ref.key, *texts]


@dataclass
class Scored:
    metrics: dict[str, float]
    n_samples: int
    seconds: float = 0.0


def select_task(dataset: EvalDataset, requested: str) -> Task:
    if requested == "auto":
        return dataset.task
    if not dataset.supports(requested):  # type: ignore[arg-type]
        kind = "an image-text retrieval" if dataset.task == "zeroshot_retrieval" else "a classification"
        raise DatasetError(f"task {requested!r} does not fit dataset {dataset.name!r}: it is {kind} dataset "
                           f"(use --task {dataset.task} or --task auto)")
    return requested  # type: ignore[return-value]


def _require_cached(store: EmbeddingStore, fields: dict, what: str, missing: list[str]) -> bool:
    if store.has(entry_key(fields)):
        return True
    missing.append(what)
    return False


def encode_dataset(session: ModelSession, dataset: EvalDataset, task: Task, store: EmbeddingStore,
                   memo: FileHashMemo, opts: EncodeOptions, progress: StageProgress,
                   sharded: dict[str, EncodeOutcome] | None = None) -> EncodedDataset:
    """``sharded``: entries the flow already encoded over its task runner ("image", "caption")."""
    sharded = sharded or {}
    started = time.perf_counter()
    identity = dataset.identity(memo)
    memo.save()
    image_fields = image_key_fields(session, identity, dataset.split, opts.limit)
    caption_fields = caption_key_fields(session, identity, dataset.split, opts.limit)
    if opts.cached_only:
        missing: list[str] = []
        _require_cached(store, image_fields, f"image embeddings of {dataset.name}", missing)
        if task == "zeroshot_retrieval":
            _require_cached(store, caption_fields, f"caption embeddings of {dataset.name}", missing)
        if missing:
            raise CacheMissError(missing)
    images = sharded.get("image") or encode_images(session, dataset, store, image_fields, opts.batch_size,
                                                   opts.num_workers, opts.on_bad_image, progress)
    if task == "zeroshot_classification":
        prompts = dataset.prompts
        outcome = encode_prompts(session, prompts.prompts(), store, opts.batch_size, progress, dataset.name)
        return EncodedDataset(task, images, prompts=outcome, n_classes=len(prompts.classnames),
                              n_templates=len(prompts.templates), seconds=time.perf_counter() - started)
    captions = [c for caps in dataset.captions for c in caps]
    sample_index = np.repeat(np.arange(len(dataset.captions), dtype=np.int64),
                             [len(caps) for caps in dataset.captions])
    texts = sharded.get("caption") or encode_texts(session, captions, store, caption_fields, "caption", opts.batch_size, progress,
                         dataset.name, aux_values={"sample_index": sample_index},
                         meta={"dataset": dataset.name, "split": dataset.split})
    return EncodedDataset(task, images, captions=texts, seconds=time.perf_counter() - started)


def score_dataset(store: EmbeddingStore, encoded: EncodedDataset, recall_k: list[int],
                  retrieval_metrics: tuple[str, ...] = ("recall",)) -> Scored:
    started = time.perf_counter()
    if encoded.task == "zeroshot_classification":
        metrics, n = score_classification(store, encoded.images.ref, encoded.prompts.pool, encoded.prompts.lookup,
                                          encoded.n_classes, encoded.n_templates)
    else:
        metrics, n = score_retrieval(store, encoded.images.ref, encoded.captions.ref, recall_k, retrieval_metrics)
    image_entry = store.open(encoded.images.ref.key)
    skipped = int(image_entry.meta.get("n_samples", image_entry.count)) - image_entry.count
    if skipped:  # only possible with --on_bad_image skip; recorded so the numbers are read with that in mind
        metrics["skipped_images"] = float(skipped)
    return Scored(metrics, n, time.perf_counter() - started)
