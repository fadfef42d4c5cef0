"""Encode stage: indexed dataset + model -> cache entries (images, captions, class prompts).

Everything here works on plain objects; Prefect wrappers live in ``flows/orchestration/stages.py``. A model is loaded at most
once per :class:`ModelSession`, and only when some entry is missing from the cache.
"""

from __future__ import annotations

import logging
from contextlib import closing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from clipcache.storage.cache_keys import AuxSpec, EmbeddingRef, entry_key
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import digest
from clipcache.storage.text_pool import PoolLookup, TextPool, text_sha256
from clipcache.tasks.contract import CacheMissError, EncodeSession, EncodeSettings
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.encode.batches import ImageBatch, iter_image_batches, model_batches  # noqa: F401 (re-exported)
from clipcache.tasks.encode.overlap import BackgroundWriter, DeviceFeeder
from clipcache.tasks.models.base import EmbeddingModel
from clipcache.tasks.models.loader import ResolvedModel
from clipcache.tasks.models.resolve import load_model
from clipcache.tasks.progress import StageProgress

if TYPE_CHECKING:
    from clipcache.tasks.models.api_client import ApiUsage

log = logging.getLogger("clipcache.encode")


@dataclass
class ModelSession:
    """A resolved model whose weights are loaded lazily, once, on first use."""

    resolved: ResolvedModel
    device: torch.device
    amp: bool
    precision: str
    model_cache_dir: str | None = None
    decode: str = "cpu"  # where images are decoded (--decode): gpu is another preprocessing, keyed apart
    _model: EmbeddingModel | None = field(default=None, repr=False)
    loads: int = 0
    progress: StageProgress | None = field(default=None, repr=False)
    worker_usage: ApiUsage | None = field(default=None, repr=False)  # what sharded workers' copies spent

    @property
    def model(self) -> EmbeddingModel:
        if self._model is None:
            progress = self.progress or StageProgress(enabled=False)
            with progress.status(f"loading model {self.resolved.display_name} on {self.device}"):
                self._model = load_model(self.resolved, self.device, self.amp, self.model_cache_dir)
            log.info("loaded model %s on %s (%s)", self.resolved.display_name, self.device, self.precision)
            self.loads += 1
        return self._model

    @property
    def loaded_model(self) -> EmbeddingModel | None:
        """The model if it is loaded now (never loads it)."""
        return self._model

    def add_worker_usage(self, usage: ApiUsage | None) -> None:
        """What a sharded worker's copy of this model spent: in this session's cost line."""
        if usage is not None:
            self.worker_usage = usage if self.worker_usage is None else self.worker_usage.plus(usage)

    def close(self, report: bool = True) -> None:
        """The run is over: let a loaded model release what it holds (an API model prints its cost line, with what
        sharded workers spent)."""
        extra, self.worker_usage = self.worker_usage, None
        if self._model is not None:
            if extra is not None:
                self._model.add_usage(extra)
            self._model.close(report)
            self._model = None
        elif extra is not None:  # every request went from workers: the line still tells what they cost
            from clipcache.tasks.models.api_model import report_usage

            report_usage(self.resolved, extra, report)  # type: ignore[arg-type]  # only API models spend


@dataclass(frozen=True)
class EncodeOutcome:
    ref: EmbeddingRef
    cache_hit: bool
    resumed: bool = False
    encoded: int = 0

    @property
    def keys(self) -> list[str]:
        return [self.ref.key]


def image_key_fields(session: EncodeSession, dataset_identity: dict[str, Any], split: str, limit: int | None) -> dict:
    # the decode mode only where it is not the default: every key made before --decode existed stays valid
    decode = {"decode": session.decode} if session.decode != "cpu" else {}
    return {"role": "image", "model": session.resolved.image_identity, "precision": session.precision,
            "dataset": dataset_identity, "split": split, "limit": limit, **decode}


def caption_key_fields(session: EncodeSession, dataset_identity: dict[str, Any], split: str, limit: int | None) -> dict:
    """Caption entries hold each distinct caption text once (``layout: distinct``) plus the caption -> row and
    caption -> sample maps."""
    return {"role": "caption", "model": session.resolved.identity, "precision": session.precision,
            "dataset": dataset_identity, "split": split, "limit": limit, "layout": "distinct"}


def require_cached(store: EmbeddingStore, fields: dict, what: str, missing: list[str]) -> bool:
    if store.has(entry_key(fields)):
        return True
    missing.append(what)
    return False


def check_cached(store: EmbeddingStore, wanted: list[tuple[dict, str]]) -> None:
    """Raise CacheMissError listing every (key fields, description) not in the cache."""
    missing: list[str] = []
    for fields, what in wanted:
        require_cached(store, fields, what, missing)
    if missing:
        raise CacheMissError(missing)


def prompt_pool_fields(session: EncodeSession, role: str = "prompt") -> dict:
    """The pool of class-prompt vectors of one model: shared by every dataset and template set. ``role="query"``:
    the pool of its query texts, for a model that embeds a query differently from a document (mteb's queries of an
    ``api:`` model with roles or prefixes); every other text is a ``prompt`` (a document to such a model)."""
    return {"role": role, "model": session.resolved.identity, "precision": session.precision}


@dataclass(frozen=True)
class PromptOutcome:
    pool: str
    lookup: PoolLookup
    encoded: int  # prompts that needed a forward pass now

    @property
    def cache_hit(self) -> bool:
        return self.encoded == 0

    @property
    def keys(self) -> list[str]:
        return list(self.lookup.batch_keys)


def encode_prompts(session: EncodeSession, prompts: list[str], store: EmbeddingStore, batch_size: int,
                   progress: StageProgress, label: str, *, role: str = "prompt") -> PromptOutcome:
    """Encode only the prompt texts this model has never seen; return where every requested prompt's vector is.
    ``role``: the pool (:func:`prompt_pool_fields`), and the kind the model embeds the texts as."""
    pool = TextPool(store, digest(prompt_pool_fields(session, role)))
    missing = pool.missing(prompts)
    encoded = 0
    if missing:
        fields = {"role": f"{role}-batch", "pool": pool.pool, "texts": digest(missing)}
        outcome = encode_texts(session, missing, store, fields, kind=role, batch_size=batch_size,
                               progress=progress, label=label,
                               aux_values={"text_sha256": text_sha256(missing)}, meta={"dataset": label},
                               raw=True)  # a few texts: their raw rows too, for mteb's raw features bit for bit
        pool.register(outcome.ref.key)
        encoded = outcome.encoded
    return PromptOutcome(pool.pool, pool.lookup(prompts), encoded)


def _cache_hit(store: EmbeddingStore, key_fields: dict) -> EncodeOutcome:
    return EncodeOutcome(store.open(entry_key(key_fields), key_fields).ref(), cache_hit=True)


def encode_images(session: EncodeSession, dataset: EvalDataset, store: EmbeddingStore, key_fields: dict,
                  settings: EncodeSettings, progress: StageProgress, *, raw: bool = False) -> EncodeOutcome:
    """Encode a dataset's images into one entry (resumable); ``raw``: a new entry keeps the raw rows too (tasks
    that hand raw features on; an entry written without them stays as it is and is read as row x norm)."""
    if store.has(entry_key(key_fields)):
        return _cache_hit(store, key_fields)
    aux: dict[str, AuxSpec] = {}
    labels = dataset.labels
    if dataset.labels is not None:
        aux["target"] = AuxSpec(str(dataset.labels.dtype), tuple(dataset.labels.shape[1:]))
    with store.writer(key_fields, "image", capacity=len(dataset), aux=aux) as writer:
        if writer.already_complete:  # another process finished it while we waited for the lock
            return _cache_hit(store, key_fields)
        model = session.model
        start = writer.start_position
        # Resume at the start of the batch that held `start` and drop the rows already committed: batches then have
        # exactly the composition of an uninterrupted run, so the vectors are bit-identical (batched matmuls need
        # not give the same bits for a row in a batch of another size).
        batch_size = settings.batch_size
        batches = model_batches(model, dataset, (start // batch_size) * batch_size, settings, device=session.device,
                                decode=session.decode)
        feeder = DeviceFeeder(model, session.device, raw=raw)
        encoded = 0
        with progress.track(f"encode images  {dataset.name}", len(dataset), "img") as advance, \
                closing(batches), BackgroundWriter(writer) as sink:
            advance(start)
            for batch in batches:
                errors = [(i, message) for i, message in batch.errors if i >= start]
                if errors and settings.on_bad_image == "error":
                    raise DatasetError(f"{errors[0][1]} (use --on_bad_image skip to skip such images)")
                for _, message in errors:
                    log.warning("skipping: %s", message)
                if batch.pixels is not None:
                    keep = batch.indices >= start
                    if keep.any():
                        indices = batch.indices[keep]
                        extra = {"target": labels[indices]} if labels is not None and "target" in aux else {}
                        # a batch-invariant model (an API) is asked only for rows not yet committed
                        vectors = (feeder.encode(batch.pixels[torch.from_numpy(keep)], batch=batch)
                                   if model.batch_invariant else
                                   feeder.encode(batch.pixels, keep=None if keep.all() else keep, batch=batch))
                        sink.add(vectors, indices, **extra)
                        encoded += len(indices)
                advance(int((batch.indices >= start).sum()) + len(errors))
        if writer.dim is None:
            raise DatasetError(f"dataset {dataset.name!r}: none of its {len(dataset)} images could be decoded")
        # Rows written < n_samples exactly when undecodable images were skipped.
        ref = writer.finish(meta={"model": session.resolved.display_name, "dataset": dataset.name,
                                  "split": dataset.split, "n_samples": len(dataset)})
    return EncodeOutcome(ref, cache_hit=False, resumed=start > 0, encoded=encoded)


def encode_texts(session: EncodeSession, texts: list[str], store: EmbeddingStore, key_fields: dict, *, kind: str,
                 batch_size: int, progress: StageProgress, label: str, aux_values: dict[str, np.ndarray] | None = None,
                 meta: dict[str, Any] | None = None,
                 extra_arrays: dict[str, np.ndarray] | None = None, raw: bool = False) -> EncodeOutcome:
    """Encode ``texts`` into one entry (resumable); ``raw``: keep the raw rows too, where the model gives them."""
    if not texts:
        raise DatasetError(f"{label}: there are no {kind}s to encode")
    if store.has(entry_key(key_fields)):
        return _cache_hit(store, key_fields)
    aux_values = aux_values or {}
    aux = {name: AuxSpec(str(v.dtype), tuple(v.shape[1:])) for name, v in aux_values.items()}
    with store.writer(key_fields, kind, capacity=len(texts), aux=aux) as writer:
        if writer.already_complete:
            return _cache_hit(store, key_fields)
        model = session.model
        start = writer.start_position
        plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
        with progress.track(f"encode {plural} {label}", len(texts), "txt") as advance, model.texts_as(kind):
            advance(start)
            # a batch-invariant model (an API) takes several batches at once (concurrent requests) and is asked
            # only for rows not yet committed; a local model gets the batches of an uninterrupted run, and the rows
            # already committed are dropped from the first
            window = batch_size * (model.text_batches_at_once if model.batch_invariant else 1)
            for lo in range((start // batch_size) * batch_size, len(texts), window):
                hi = min(lo + window, len(texts))
                first = max(start, lo)
                raw_rows = None
                if model.batch_invariant:
                    vectors, norms = model.encode_text_batches([texts[i:min(i + batch_size, hi)]
                                                                for i in range(first, hi, batch_size)])
                elif raw:
                    vectors, norms, raw_rows = model.encode_texts_with_raw(texts[lo:hi])
                    vectors, norms = _rows_from((vectors, norms), first - lo)
                    raw_rows = None if raw_rows is None or norms is None else raw_rows[first - lo:]
                else:
                    vectors, norms = _rows_from(model.encode_texts_with_norms(texts[lo:hi]), first - lo)
                writer.add(vectors, np.arange(first, hi, dtype=np.int64), norms=norms, raw=raw_rows,
                           **{name: v[first:hi] for name, v in aux_values.items()})
                advance(hi - first)
        ref = writer.finish(meta={"model": session.resolved.display_name, **(meta or {})}, extra_arrays=extra_arrays)
    return EncodeOutcome(ref, cache_hit=False, resumed=start > 0, encoded=len(texts) - start)


def _rows_from(encoded: tuple[np.ndarray, np.ndarray | None], first: int) -> tuple[np.ndarray, np.ndarray | None]:
    vectors, norms = encoded
    return vectors[first:], None if norms is None else norms[first:]


def distinct_captions(dataset: EvalDataset) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(distinct caption texts in first-seen order, row of each caption among them, sample of each caption).
    COCO and Flickr repeat captions exactly, templated sets far more: each text is encoded once."""
    rows: dict[str, int] = {}
    caption_row, caption_sample = [], []
    for sample, captions in enumerate(dataset.captions or []):
        for text in captions:
            caption_row.append(rows.setdefault(text, len(rows)))
            caption_sample.append(sample)
    return list(rows), np.asarray(caption_row, dtype=np.int64), np.asarray(caption_sample, dtype=np.int64)


def encode_captions(session: EncodeSession, dataset: EvalDataset, store: EmbeddingStore, key_fields: dict,
                    settings: EncodeSettings, progress: StageProgress) -> EncodeOutcome:
    """The caption entry of a retrieval dataset: one row per distinct text, and the maps back to captions."""
    texts, caption_row, caption_sample = distinct_captions(dataset)
    return encode_texts(session, texts, store, key_fields, kind="caption", batch_size=settings.batch_size,
                        progress=progress, label=dataset.name,
                        meta={"dataset": dataset.name, "split": dataset.split, "captions": len(caption_row)},
                        extra_arrays={"caption_row": caption_row, "caption_sample": caption_sample})
