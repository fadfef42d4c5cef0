"""One (model, dataset) evaluation as plain functions: choose the task, encode what is missing, score from the cache."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from storage.embedding_store import EmbeddingStore
from storage.errors import ConfigError, DatasetError
from storage.hashing import FileHashMemo
from tasks.encode.datasets.base import EvalDataset, Task
from tasks.encode.stage import (
    EncodeOutcome,
    ModelSession,
    caption_key_fields,
    encode_images,
    encode_texts,
    image_key_fields,
    prompt_key_fields,
)
from tasks.progress import StageProgress
from tasks.score.stage import score_classification, score_retrieval


@dataclass(frozen=True)
class EncodeOptions:
    batch_size: int = 64
    num_workers: int = 2
    on_bad_image: str = "error"
    limit: int | None = None


@dataclass
class EncodedDataset:
    """References to the cache entries one evaluation needs (small; no arrays)."""

    task: Task
    images: EncodeOutcome
    texts: EncodeOutcome
    n_classes: int = 0
    n_templates: int = 0
    seconds: float = 0.0

    @property
    def cache_hit(self) -> bool:
        return self.images.cache_hit and self.texts.cache_hit

    @property
    def cache_keys(self) -> list[str]:
        return [self.images.ref.key, self.texts.ref.key]


@dataclass
class Scored:
    metrics: dict[str, float]
    n_samples: int
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def select_task(dataset: EvalDataset, requested: str) -> Task:
    if requested == "auto":
        return dataset.task
    if not dataset.supports(requested):  # type: ignore[arg-type]
        kind = "an image-text retrieval" if dataset.task == "zeroshot_retrieval" else "a classification"
        raise DatasetError(f"task {requested!r} does not fit dataset {dataset.name!r}: it is {kind} dataset "
                           f"(use --task {dataset.task} or --task auto)")
    return requested  # type: ignore[return-value]


def check_language(dataset: EvalDataset, task: Task, language: str) -> None:
    """Only class prompts depend on the language; say so rather than silently mislabel the result."""
    if task == "zeroshot_classification" and dataset.prompts is not None and language != dataset.prompts.language:
        raise ConfigError(f"language: {language!r} is not available for dataset {dataset.name!r} "
                          f"(its class names and templates are {dataset.prompts.language!r})")


def encode_dataset(session: ModelSession, dataset: EvalDataset, task: Task, store: EmbeddingStore,
                   memo: FileHashMemo, opts: EncodeOptions, progress: StageProgress) -> EncodedDataset:
    started = time.perf_counter()
    identity = dataset.identity(memo)
    memo.save()
    images = encode_images(session, dataset, store, image_key_fields(session, identity, dataset.split, opts.limit),
                           opts.batch_size, opts.num_workers, opts.on_bad_image, progress)
    if task == "zeroshot_classification":
        prompts = dataset.prompts
        texts = encode_texts(session, prompts.prompts(), store, prompt_key_fields(session, prompts.prompts()),
                             "prompt", opts.batch_size, progress, dataset.name,
                             meta={"classnames": prompts.classnames, "templates": prompts.templates,
                                   "language": prompts.language})
        return EncodedDataset(task, images, texts, len(prompts.classnames), len(prompts.templates),
                              time.perf_counter() - started)
    captions = [c for caps in dataset.captions for c in caps]
    sample_index = np.repeat(np.arange(len(dataset.captions), dtype=np.int64),
                             [len(caps) for caps in dataset.captions])
    texts = encode_texts(session, captions, store,
                         caption_key_fields(session, identity, dataset.split, opts.limit), "caption",
                         opts.batch_size, progress, dataset.name, aux_values={"sample_index": sample_index},
                         meta={"dataset": dataset.name, "split": dataset.split})
    return EncodedDataset(task, images, texts, seconds=time.perf_counter() - started)


def score_dataset(store: EmbeddingStore, encoded: EncodedDataset, recall_k: list[int]) -> Scored:
    started = time.perf_counter()
    if encoded.task == "zeroshot_classification":
        metrics, n = score_classification(store, encoded.images.ref, encoded.texts.ref, encoded.n_classes,
                                          encoded.n_templates)
    else:
        metrics, n = score_retrieval(store, encoded.images.ref, encoded.texts.ref, recall_k)
    image_entry = store.open(encoded.images.ref.key)
    skipped = int(image_entry.meta.get("n_samples", image_entry.count)) - image_entry.count
    if skipped:  # only possible with --on_bad_image skip; recorded so the numbers are read with that in mind
        metrics["skipped_images"] = float(skipped)
    return Scored(metrics, n, time.perf_counter() - started)
