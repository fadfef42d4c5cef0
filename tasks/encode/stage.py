"""Encode stage: indexed dataset + model -> cache entries (images, captions, class prompts).

Everything here works on plain objects; Prefect wrappers live in :mod:`tasks.prefect_tasks`. A model is loaded at most
once per :class:`ModelSession`, and only when some entry is missing from the cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from storage.embedding_store import AuxSpec, EmbeddingRef, EmbeddingStore, entry_key
from storage.errors import DatasetError
from tasks.encode.datasets.base import EvalDataset
from tasks.encode.models.base import EmbeddingModel
from tasks.encode.models.resolve import ResolvedModel, load_model
from tasks.progress import StageProgress

log = logging.getLogger("clipcache.encode")


@dataclass
class ModelSession:
    """A resolved model whose weights are loaded lazily, once, on first use."""

    resolved: ResolvedModel
    device: torch.device
    amp: bool
    precision: str
    model_cache_dir: str | None = None
    _model: EmbeddingModel | None = field(default=None, repr=False)
    loads: int = 0

    @property
    def model(self) -> EmbeddingModel:
        if self._model is None:
            self._model = load_model(self.resolved, self.device, self.amp, self.model_cache_dir)
            self.loads += 1
        return self._model


@dataclass(frozen=True)
class EncodeOutcome:
    ref: EmbeddingRef
    cache_hit: bool
    resumed: bool = False
    encoded: int = 0


def image_key_fields(session: ModelSession, dataset_identity: dict[str, Any], split: str, limit: int | None) -> dict:
    return {"role": "image", "model": session.resolved.identity, "precision": session.precision,
            "dataset": dataset_identity, "split": split, "limit": limit}


def caption_key_fields(session: ModelSession, dataset_identity: dict[str, Any], split: str, limit: int | None) -> dict:
    return {"role": "caption", "model": session.resolved.identity, "precision": session.precision,
            "dataset": dataset_identity, "split": split, "limit": limit}


def prompt_key_fields(session: ModelSession, prompts: list[str]) -> dict:
    from storage.hashing import digest

    return {"role": "prompt", "model": session.resolved.identity, "precision": session.precision,
            "prompts": digest(prompts), "count": len(prompts)}


class _ImageItems(Dataset):
    """Decodes and transforms images by position; a bad image is reported back, not raised, so the main process
    decides (error or skip) with a clean message instead of a worker traceback."""

    def __init__(self, dataset: EvalDataset, transform: Any, start: int):
        self.dataset, self.transform, self.start = dataset, transform, start

    def __len__(self) -> int:
        return len(self.dataset) - self.start

    def __getitem__(self, j: int) -> tuple[int, torch.Tensor | None, str | None]:
        i = self.start + j
        try:
            return i, self.transform(self.dataset.load_image(i)), None
        except DatasetError as e:
            return i, None, str(e)


def _collate(batch: list[tuple[int, torch.Tensor | None, str | None]]):
    ok = [(i, t) for i, t, err in batch if err is None]
    errors = [(i, err) for i, _, err in batch if err is not None]
    indices = np.array([i for i, _ in ok], dtype=np.int64)
    pixels = torch.stack([t for _, t in ok]) if ok else None
    last = max(i for i, _, _ in batch)
    return indices, pixels, errors, last


def encode_images(session: ModelSession, dataset: EvalDataset, store: EmbeddingStore, key_fields: dict,
                  batch_size: int, num_workers: int, on_bad_image: str, progress: StageProgress) -> EncodeOutcome:
    key = entry_key(key_fields)
    if store.has(key):
        return EncodeOutcome(store.open(key, key_fields).ref(), cache_hit=True)
    aux: dict[str, AuxSpec] = {}
    if dataset.labels is not None:
        aux["target"] = AuxSpec(str(dataset.labels.dtype), tuple(dataset.labels.shape[1:]))
    with store.writer(key_fields, "image", capacity=len(dataset), aux=aux) as writer:
        if writer.already_complete:  # another process finished it while we waited for the lock
            return EncodeOutcome(store.open(key, key_fields).ref(), cache_hit=True)
        model = session.model
        start = writer.start_position
        items = _ImageItems(dataset, model.image_transform, start)
        # More workers than batches would only idle; never more than the samples left (clip_benchmark fails there).
        workers = max(0, min(num_workers, len(items)))
        loader = DataLoader(items, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=_collate,
                            persistent_workers=False)
        encoded = 0
        with progress.track(f"encode images  {dataset.name}", len(dataset), "img") as advance:
            advance(start)
            for indices, pixels, errors, last in loader:
                if errors and on_bad_image == "error":
                    raise DatasetError(f"{errors[0][1]} (use --on_bad_image skip to skip such images)")
                for _, message in errors:
                    log.warning("skipping: %s", message)
                if pixels is not None:
                    extra = {"target": dataset.labels[indices]} if "target" in aux else {}
                    writer.add(model.encode_images(pixels), indices, **extra)
                    encoded += len(indices)
                advance(len(indices) + len(errors))
        ref = writer.finish(meta={"dataset": dataset.name, "split": dataset.split, "n_samples": len(dataset),
                                  "n_skipped": len(dataset) - writer.rows_committed})
    return EncodeOutcome(ref, cache_hit=False, resumed=start > 0, encoded=encoded)


def encode_texts(session: ModelSession, texts: list[str], store: EmbeddingStore, key_fields: dict, kind: str,
                 batch_size: int, progress: StageProgress, label: str, aux_values: dict[str, np.ndarray] | None = None,
                 meta: dict[str, Any] | None = None) -> EncodeOutcome:
    key = entry_key(key_fields)
    if store.has(key):
        return EncodeOutcome(store.open(key, key_fields).ref(), cache_hit=True)
    aux_values = aux_values or {}
    aux = {name: AuxSpec(str(v.dtype), tuple(v.shape[1:])) for name, v in aux_values.items()}
    with store.writer(key_fields, kind, capacity=len(texts), aux=aux) as writer:
        if writer.already_complete:
            return EncodeOutcome(store.open(key, key_fields).ref(), cache_hit=True)
        model = session.model
        start = writer.start_position
        with progress.track(f"encode {kind}s {label}", len(texts), "txt") as advance:
            advance(start)
            for lo in range(start, len(texts), batch_size):
                hi = min(lo + batch_size, len(texts))
                positions = np.arange(lo, hi, dtype=np.int64)
                writer.add(model.encode_texts(texts[lo:hi]), positions,
                           **{name: v[lo:hi] for name, v in aux_values.items()})
                advance(hi - lo)
        ref = writer.finish(meta=meta)
    return EncodeOutcome(ref, cache_hit=False, resumed=start > 0, encoded=len(texts) - start)
