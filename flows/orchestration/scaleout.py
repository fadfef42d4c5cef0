"""``--task_runner``: shard encoding over a Prefect task runner (threads, a local Dask cluster, or a Dask scheduler).

The flow stays the coordinator: it plans the shards of each missing cache entry, holds the entry's lock, submits one
``encode-shard`` task per shard to the runner, and publishes the entry when all are done (tasks/encode/sharded.py).
Scoring and everything else run in the flow as before. The runner is opened once per flow run, so a Dask cluster
starts once (~8 s here) and workers keep their loaded model across shards, datasets and entries.

Multi-GPU: one worker per GPU. ``--task_runner dask`` on a machine with several GPUs starts one worker per GPU and
worker N uses ``cuda:N`` (device ``auto``); with an existing scheduler, start each worker with its own
``CUDA_VISIBLE_DEVICES``. (Written from torch's and Dask's documented behaviour; no GPU on the machines this was
developed on.)
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from functools import cache
from typing import Any, Literal, cast

import numpy as np

from clipcache.storage.cache_keys import entry_key
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import ClipcacheError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.contract import EncodeSettings, Prepared
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.encode import sharded
from clipcache.tasks.encode.sharded import ShardJob, WorkerModel, plan_shards, prepare_entry, publish_sharded
from clipcache.tasks.encode.stage import (
    EncodeOutcome,
    ModelSession,
    caption_key_fields,
    distinct_captions,
    image_key_fields,
)
from clipcache.tasks.evaluation.base import EvalTask
from clipcache.tasks.progress import StageProgress

SHARDABLE_ROLES = ("image", "caption")


@cache
def shard_tasks() -> tuple[Any, Any]:
    """(encode-shard, probe-model): the Prefect tasks submitted to the flow's --task_runner (threads or Dask
    workers). Built on first use, so a run without a task runner never imports Prefect for them."""
    from prefect import task as prefect_task
    from prefect.cache_policies import NO_CACHE

    task: Any = prefect_task  # its overloads do not cover a task_run_name template with a cache policy

    return (task(sharded.encode_shard, name="encode-shard", cache_policy=NO_CACHE,
                 task_run_name="encode-{job.role}-rows-{job.lo}-{job.hi}"),
            task(sharded.probe_dim, name="probe-model", cache_policy=NO_CACHE))


def default_workers() -> int:
    import torch

    return torch.cuda.device_count() or os.cpu_count() or 1


def open_task_runner(task_runner: str, workers: int | None) -> AbstractContextManager:
    """The runner for ``task_runner`` (entered by the caller), or a null context for ``none``."""
    if task_runner == "none":
        return nullcontext(None)
    n = workers or default_workers()
    if task_runner == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=n)
    from prefect_dask import DaskTaskRunner

    if task_runner != "dask":
        return DaskTaskRunner(address="tcp://" + task_runner.split("://", 1)[1] if task_runner.startswith("dask://")
                              else task_runner)
    # Workers report their task runs to the flow's API (the ephemeral one included) instead of each starting its own
    # server. Dask's nanny gives each worker OMP_NUM_THREADS=1: one torch thread per worker process.
    env = {"PREFECT_API_URL": _api_url()} if _api_url() else {}
    # Cluster start-up chatter: quiet here and in the workers, which read dask's config from the environment they
    # inherit when spawned (the nanny's `env` is applied too late for it). Exporting the variable overrides this.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    return DaskTaskRunner(cluster_kwargs={"n_workers": n, "threads_per_worker": 1, "processes": True,
                                          "dashboard_address": None, "silence_logs": logging.ERROR, "env": env})


def _api_url() -> str | None:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return str(ctx.client.api_url) if ctx is not None and ctx.client is not None else None


def _tiny_last_batch(job: ShardJob, rows: int, batch_size: int) -> bool:
    """Whether ``job`` holds the entry's last batch and it has fewer than 8 rows. MKL multiplies such thin matrices
    on another code path, whose results depend on the thread count; a worker process has one thread, the flow its
    own, so that batch is encoded here in the flow, as a single-process run does, to keep entries bit-identical."""
    return job.hi == rows and 0 < rows % batch_size < 8


class ShardedEncoder:
    """Encodes the image and caption entries of one evaluation through ``runner`` (see the module docstring)."""

    def __init__(self, runner: Any, store: EmbeddingStore, settings: EncodeSettings, progress: StageProgress, *,
                 task_runner: str, workers: int | None, shard_rows: int | None, device: str,
                 model_cache_dir: str | None):
        self.runner = runner
        self.store = store
        self.settings = replace(settings, options=None)  # what every shard encodes with (no task options)
        self.progress = progress
        self.task_runner = task_runner  # named in errors
        self.workers = workers or default_workers()
        self.shard_rows = shard_rows
        self.device = device  # as the user gave it: a worker resolves "auto" to its own GPU
        self.model_cache_dir = model_cache_dir
        self._dims: dict[str, int] = {}

    def _worker_model(self, session: ModelSession) -> WorkerModel:
        return WorkerModel(session.resolved, self.device, session.amp, session.precision, self.model_cache_dir,
                           decode=session.decode)

    def _dim(self, session: ModelSession, model: WorkerModel) -> int:
        key = entry_key({"model": model.resolved.identity, "precision": model.precision})
        if key not in self._dims:  # the first submission: a Dask runner connects / starts its cluster here
            try:
                self._dims[key], usage = self.runner.submit(shard_tasks()[1], parameters={"model": model}).result()
            except (OSError, TimeoutError) as e:
                raise ClipcacheError(f"task_runner {self.task_runner}: cannot reach the workers ({e})") from e
            session.add_worker_usage(usage)
        return self._dims[key]

    def encode_pair(self, session: ModelSession, task: EvalTask, prepared: Prepared,
                    memo: FileHashMemo) -> dict[str, EncodeOutcome]:
        """The image (and caption) entries of one pair over the task runner; what is cached already is left to the
        task's own encode step, which finds it there."""
        dataset: EvalDataset = prepared.data
        roles = [cast(Literal["image", "caption"], role) for role in task.needs if role in SHARDABLE_ROLES]
        if not roles or not isinstance(dataset, EvalDataset):
            return {}
        identity = dataset.identity(memo)
        fields = {"image": image_key_fields(session, dataset.image_identity(memo), dataset.split,
                                            prepared.source.limit),
                  "caption": caption_key_fields(session, identity, dataset.split, prepared.source.limit)}
        memo.save()
        done = {role: self.encode(session, dataset, prepared, identity, role, fields[role]) for role in roles}
        return {role: outcome for role, outcome in done.items() if outcome is not None}

    def encode(self, session: ModelSession, dataset: EvalDataset, prepared: Prepared, identity: dict[str, Any],
               role: Literal["image", "caption"], key_fields: dict[str, Any]) -> EncodeOutcome | None:
        """Encode one entry sharded; None when it is already cached (the caller's cache path takes it)."""
        key = entry_key(key_fields)
        if self.store.has(key):
            return None
        extra: dict[str, np.ndarray] = {}
        if role == "image":
            rows = len(dataset)
            aux = {"target": dataset.labels} if dataset.labels is not None else {}
            meta = {"model": session.resolved.display_name, "dataset": dataset.name, "split": dataset.split,
                    "n_samples": len(dataset)}
            label, unit = f"encode images  {dataset.name}", "img"
        else:
            texts, caption_row, caption_sample = distinct_captions(dataset)
            rows, aux = len(texts), {}
            extra = {"caption_row": caption_row, "caption_sample": caption_sample}
            meta = {"model": session.resolved.display_name, "dataset": dataset.name, "split": dataset.split,
                    "captions": len(caption_row)}
            label, unit = f"encode captions {dataset.name}", "txt"
        batch_size = self.settings.batch_size
        plan = plan_shards(rows, batch_size, self.workers, self.shard_rows)
        model = self._worker_model(session)
        with self.store.lock(key):
            if self.store.has(key):
                return None
            pending = prepare_entry(self.store, key_fields, plan, self._dim(session, model),
                                    {k: np.asarray(v) for k, v in aux.items()})
            jobs = [ShardJob(store_root=str(self.store.root), key=key, role=role, lo=lo, hi=hi, source=prepared.source,
                             identity=identity, model=model, settings=self.settings)
                    for lo, hi in pending]
            encoded = 0
            with self.progress.track(label, rows, unit) as advance:
                advance(rows - sum(hi - lo for lo, hi in pending))
                here = [job for job in jobs if _tiny_last_batch(job, rows, batch_size)]
                futures = [self.runner.submit(shard_tasks()[0], parameters={"job": job}) for job in jobs
                           if job not in here]
                from prefect.futures import as_completed

                for done in [sharded.encode_shard(job) for job in here]:
                    encoded += done.encoded
                    session.add_worker_usage(done.usage)
                    advance(done.hi - done.lo)
                for future in as_completed(futures):
                    done = future.result()
                    encoded += done.encoded
                    session.add_worker_usage(done.usage)
                    advance(done.hi - done.lo)
            ref = publish_sharded(self.store, key_fields, role, plan, aux_names=list(aux), meta=meta,
                                      extra_arrays=extra)
        return EncodeOutcome(ref, cache_hit=False, resumed=len(pending) < len(plan.shards), encoded=encoded)
