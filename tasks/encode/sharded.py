"""Sharded encode: one cache entry written by several workers, each into its own rows, then published once.

The coordinator plans shard ranges, creates the partial entry (every array at full size; ``position`` and the
per-row data it already knows are written up front) and hands each worker a :class:`ShardJob`: a small, picklable
description from which the worker re-opens the dataset and the model itself (both kept per worker process, so a
worker loads the model once for all its shards). A worker writes only ``embeddings[lo:hi]``, and shard boundaries
fall on the entry's chunk boundaries, so no two workers ever touch the same Zarr chunk (Zarr has no locks; a chunk
written by two writers loses rows). A finished shard leaves ``shards/<lo>-<hi>.json``; after a crash, a rerun with
the same plan (``plan.json``) redoes only the shards without one. The coordinator then checksums the rows, drops
rows of images skipped as undecodable, and publishes the entry like the single-process writer does.

Vectors equal the single-process encode to the bit: shards start on batch boundaries, so every batch has the same
composition as in one process (a batched matmul need not give the same bits for a row in another batch).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass
from math import ceil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from clipcache.storage.atomic import atomic_write_json
from clipcache.storage.cache_keys import EmbeddingRef, chunk_rows_setting, entry_key
from clipcache.storage.cache_writer import publish_entry
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError, ModelError
from clipcache.storage.hashing import FileHashMemo, canonical_json
from clipcache.storage.paths import AnyPath, rmtree
from clipcache.storage.zarr_io import member, open_group
from clipcache.tasks.contract import DataSource, EncodeSettings
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.encode.batches import model_batches
from clipcache.tasks.encode.stage import ModelSession, distinct_captions
from clipcache.tasks.models.loader import ResolvedModel

if TYPE_CHECKING:
    from clipcache.tasks.models.api_client import ApiUsage

log = logging.getLogger("clipcache.encode")

SHARD_ROWS_CAP = 65_536  # default shard size limit: fine-grained resume, bounded worker memory (256 MB at 1024-d)


@dataclass(frozen=True)
class ShardPlan:
    rows: int
    chunk_rows: int
    shards: tuple[tuple[int, int], ...]


def plan_shards(rows: int, batch_size: int, workers: int, shard_rows: int | None = None) -> ShardPlan:
    """Shard ranges starting on batch boundaries, and a chunk size that divides the shard size.

    Default: about two shards per worker (a slow worker does not hold up the end), at most ``SHARD_ROWS_CAP`` rows.
    """
    if shard_rows is None:
        shard_rows = min(SHARD_ROWS_CAP, ceil(rows / max(1, 2 * workers)))
    per_shard = max(1, ceil(shard_rows / batch_size))  # batches per shard
    shard_rows = per_shard * batch_size
    # chunk = batch_size * d with d dividing per_shard and the chunk at most chunk_rows rows (or one batch).
    limit = max(1, chunk_rows_setting() // batch_size)
    d = max(x for x in range(1, min(per_shard, limit) + 1) if per_shard % x == 0)
    shards = tuple((lo, min(lo + shard_rows, rows)) for lo in range(0, rows, shard_rows))
    return ShardPlan(rows, batch_size * d, shards)


@dataclass(frozen=True)
class WorkerModel:
    resolved: ResolvedModel
    device: str
    amp: bool
    precision: str
    model_cache_dir: str | None = None
    decode: str = "cpu"  # --decode: part of the image entry's key, so every worker decodes alike


@dataclass(frozen=True, kw_only=True)
class ShardJob:
    """Rows ``[lo, hi)`` of the entry ``key`` (``role``) in the store at ``store_root``: what a worker needs to
    encode them on its own."""

    store_root: str
    key: str
    role: Literal["image", "caption"]
    lo: int
    hi: int
    source: DataSource
    identity: dict[str, Any]  # the coordinator's dataset identity: the worker must find the same data
    model: WorkerModel
    settings: EncodeSettings  # batch size, decoding threads, what a bad image does (no task options)


@dataclass(frozen=True)
class ShardDone:
    lo: int
    hi: int
    encoded: int
    skipped: tuple[int, ...] = ()
    cached: bool = False  # finished by an earlier, interrupted run
    usage: ApiUsage | None = None  # what the worker's copy of an API model spent since its last report


# -- per worker process -------------------------------------------------------------------------------------------
_lock = threading.Lock()
_sessions: dict[str, ModelSession] = {}
_datasets: dict[str, EvalDataset] = {}


_reported: dict[str, ApiUsage] = {}  # per worker session: the usage already handed back to the flow


def _session_key(model: WorkerModel) -> str:
    return canonical_json([model.resolved.identity, model.device, model.amp, model.decode])


def usage_since_last_report(model: WorkerModel) -> ApiUsage | None:
    """What this worker's copy of an API model spent since the last call (its canaries included, the first time):
    handed back with each shard, so the flow's cost line counts every request its workers sent."""
    key = _session_key(model)
    with _lock:
        session = _sessions.get(key)
        model_now = session.loaded_model if session is not None else None
        now = model_now.usage() if model_now is not None else None
        if now is None:
            return None
        before = _reported.get(key)
        _reported[key] = now
    return now if before is None else now.minus(before)


def worker_session(model: WorkerModel) -> ModelSession:
    from clipcache.tasks.models.devices import precision_name, resolve_device

    key = _session_key(model)
    with _lock:
        if key not in _sessions:
            device = resolve_device(_gpu_of_this_worker() if model.device == "auto" else model.device)
            precision = precision_name(device, model.amp)
            if precision != model.precision:
                raise ModelError(f"this worker runs {model.device!r} as {device} ({precision}) but the entry is "
                                 f"keyed {model.precision}: give workers the same kind of device as the flow "
                                 f"(or pass --device explicitly)")
            _sessions[key] = ModelSession(model.resolved, device, model.amp, precision, model.model_cache_dir,
                                          decode=model.decode)
        return _sessions[key]


def _gpu_of_this_worker() -> str:
    """``auto`` on a Dask worker of a multi-GPU machine: worker N of a local cluster takes ``cuda:N`` (mod the GPU
    count), so one worker per GPU spreads the shards over all of them."""
    import torch

    count = torch.cuda.device_count()
    if count > 1:
        try:
            from distributed import get_worker

            name = get_worker().name
        except (ImportError, ValueError):
            return "auto"
        if isinstance(name, int):
            return f"cuda:{name % count}"
    return "auto"


def worker_dataset(source: DataSource, identity: dict[str, Any]) -> EvalDataset:
    key = canonical_json(asdict(source))
    with _lock:
        if key not in _datasets:
            dataset = source.open()
            memo = FileHashMemo(Path(source.data_dir) / "file_hashes.json" if source.data_dir else None)
            found = dataset.identity(memo)
            memo.save()
            if canonical_json(found) != canonical_json(identity):
                raise DatasetError(f"dataset {source.name!r} on this worker differs from the flow's (its files hash "
                                   f"differently): workers must see the same data")
            _datasets[key] = dataset
        return _datasets[key]


def _marker(store: EmbeddingStore, key: str, lo: int, hi: int) -> AnyPath:
    return store.partial_path(key) / "shards" / f"{lo}-{hi}.json"


def encode_shard(job: ShardJob) -> ShardDone:
    """Encode rows [lo, hi) of one entry into their region (runs on a worker)."""
    store = EmbeddingStore(job.store_root)
    marker = _marker(store, job.key, job.lo, job.hi)
    if marker.exists():
        done = json.loads(marker.read_text())
        return ShardDone(job.lo, job.hi, 0, tuple(done["skipped"]), cached=True)
    dataset = worker_dataset(job.source, job.identity)
    session = worker_session(job.model)
    model = session.model
    group = open_group(store.partial_path(job.key), "r+")
    skipped: list[int] = []
    # each row's norm before normalisation, where the model gives it (see EmbeddingModel.encode_images_with_norms)
    norms: np.ndarray | None = np.zeros(job.hi - job.lo, dtype=np.float32)
    if job.role == "image":
        # rows of skipped images stay zero here; publish_sharded drops them (a shard may even skip every image)
        out = np.zeros((job.hi - job.lo, member(group, "embeddings").shape[1]), dtype=np.float32)
        for batch in model_batches(model, dataset, job.lo, job.settings, device=session.device,
                                   decode=session.decode, stop=job.hi):
            if batch.errors and job.settings.on_bad_image == "error":
                raise DatasetError(f"{batch.errors[0][1]} (use --on_bad_image skip to skip such images)")
            for index, message in batch.errors:
                log.warning("skipping: %s", message)
                skipped.append(int(index))
            if batch.pixels is not None:
                vectors, batch_norms = model.encode_images_with_norms(batch.pixels)
                out[batch.indices - job.lo] = vectors
                if norms is not None and batch_norms is not None:
                    norms[batch.indices - job.lo] = batch_norms
                else:
                    norms = None
    else:
        texts = distinct_captions(dataset)[0][job.lo : job.hi]
        batch_size = job.settings.batch_size
        # one call for the shard's batches: an API model sends them as concurrent requests
        vectors, norms = model.encode_text_batches([texts[i : i + batch_size]
                                                    for i in range(0, len(texts), batch_size)])
        out = vectors.astype(np.float32, copy=False)
    member(group, "embeddings")[job.lo : job.hi] = out
    with_norms = False
    if norms is not None and "norms" in group:  # a partial entry prepared before norms were kept has none
        member(group, "norms")[job.lo : job.hi] = norms
        with_norms = True
    atomic_write_json(marker, {"lo": job.lo, "hi": job.hi, "skipped": skipped, "norms": with_norms})
    return ShardDone(job.lo, job.hi, job.hi - job.lo - len(skipped), tuple(skipped),
                     usage=usage_since_last_report(job.model))


def probe_dim(model: WorkerModel) -> tuple[int, ApiUsage | None]:
    """The embedding width, from one short text through the model (also warms the worker's model cache), and what
    an API model spent on it."""
    dim = int(worker_session(model).model.encode_texts(["a photo"]).shape[1])
    return dim, usage_since_last_report(model)


# -- coordinator --------------------------------------------------------------------------------------------------
def prepare_entry(store: EmbeddingStore, key_fields: dict[str, Any], plan: ShardPlan, dim: int,
                  aux: dict[str, np.ndarray]) -> list[tuple[int, int]]:
    """Create the partial entry for ``plan`` (or keep the one an interrupted run left with the same plan); return
    the shard ranges still to encode. Call with the key's lock held."""
    key = entry_key(key_fields)
    partial = store.partial_path(key)
    plan_doc = {"key": key, "dim": dim, **asdict(plan)}
    plan_doc["shards"] = [list(s) for s in plan.shards]
    plan_file = partial / "plan.json"
    try:
        existing = json.loads(plan_file.read_text())
    except (OSError, ValueError):
        existing = None
    if existing != plan_doc:
        if partial.exists():
            rmtree(partial)  # another plan, or a single-process partial: its rows are not reusable here
        group = open_group(partial, "w")
        rows, chunk = plan.rows, plan.chunk_rows
        group.create_array("embeddings", shape=(rows, dim), chunks=(chunk, dim), dtype="float32",
                           compressors=None, fill_value=0.0)
        group.create_array("position", shape=(rows,), chunks=(chunk,), dtype="int64", compressors=None,
                           fill_value=-1)
        member(group, "position")[:] = np.arange(rows, dtype=np.int64)
        # kept only if every shard's model gave norms (publish_sharded drops it otherwise)
        group.create_array("norms", shape=(rows,), chunks=(chunk,), dtype="float32", compressors=None,
                           fill_value=0.0)
        for name, values in aux.items():
            arr = group.create_array(name, shape=values.shape, chunks=(chunk, *values.shape[1:]),
                                     dtype=values.dtype, compressors=None)
            arr[:] = values
        atomic_write_json(plan_file, plan_doc)
    return [(lo, hi) for lo, hi in plan.shards if not _marker(store, key, lo, hi).exists()]


def publish_sharded(store: EmbeddingStore, key_fields: dict[str, Any], kind: str, plan: ShardPlan, *,
                    aux_names: list[str], meta: dict[str, Any],
                    extra_arrays: dict[str, np.ndarray] | None = None) -> EmbeddingRef:
    """Check every shard is done, drop skipped rows, checksum and publish. Call with the key's lock held."""
    key = entry_key(key_fields)
    skipped: list[int] = []
    with_norms = True
    for lo, hi in plan.shards:
        marker = _marker(store, key, lo, hi)
        if not marker.exists():
            raise DatasetError(f"cache entry {key}: shard {lo}..{hi - 1} was not written")
        done = json.loads(marker.read_text())
        skipped += done["skipped"]
        with_norms = with_norms and bool(done.get("norms"))
    group = open_group(store.partial_path(key), "r+")
    if not with_norms and "norms" in group:  # some shard's model gave none: the entry keeps none, as one process's
        del group["norms"]
    names = ["embeddings", "position", *(["norms"] if with_norms else []), *aux_names]
    rows = plan.rows
    if skipped:  # the single-process writer never stores skipped images: close the gaps the same way
        keep = np.ones(plan.rows, dtype=bool)
        keep[skipped] = False
        for name in names:
            member(group, name)[: int(keep.sum())] = np.asarray(member(group, name)[...])[keep]
        rows = int(keep.sum())
        if rows == 0:
            raise DatasetError(f"dataset {meta.get('dataset')!r}: none of its {plan.rows} images could be decoded")
    dim = int(member(group, "embeddings").shape[1])
    return publish_entry(store, key_fields, kind, rows=rows, dim=dim, arrays=names, seals=None, meta=meta,
                         scratch=("plan.json", "shards"),
                         extra_arrays=extra_arrays)
