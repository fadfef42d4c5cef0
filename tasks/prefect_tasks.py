"""Thin Prefect task wrappers around the plain stage functions (the only place in tasks/ that imports Prefect).

Our own cache decides what is recomputed, so Prefect's input caching is off (NO_CACHE): hashing a model session or a
dataset index would cost time and mean nothing. Retries stay off too: nothing here is transient (bad files stay bad).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from clipcache.tasks import evaluation, results
from clipcache.tasks.encode import sharded

select_task = task(evaluation.select_task, name="select-task", cache_policy=NO_CACHE)
encode = task(evaluation.encode_dataset, name="encode", cache_policy=NO_CACHE)
score = task(evaluation.score_dataset, name="score", cache_policy=NO_CACHE)
write_results = task(results.write_pair_results, name="write-results", cache_policy=NO_CACHE)
# Submitted to the flow's --task_runner (threads or Dask workers); see flows/scaleout.py.
encode_shard = task(sharded.encode_shard, name="encode-shard", cache_policy=NO_CACHE,
                    task_run_name="encode-{job.role}-rows-{job.lo}-{job.hi}")
probe_dim = task(sharded.probe_dim, name="probe-model", cache_policy=NO_CACHE)


@task(name="open-dataset", cache_policy=NO_CACHE)
def open_dataset(name: str, dataset_root: str | None, split: str, limit: int | None, hub: str = "huggingface",
                 cache_dir: str | None = None, offline: bool = False, progress=None):
    from clipcache.tasks.datasets import open_dataset as _open

    return _open(name, dataset_root, split, limit, hub, cache_dir, offline, progress)


@task(name="prepare-model", cache_policy=NO_CACHE)
def prepare_model(spec, memo, device: str, amp: bool, model_cache_dir: str | None):
    from clipcache.tasks.encode.stage import ModelSession
    from clipcache.tasks.models.devices import precision_name, resolve_device
    from clipcache.tasks.models.resolve import resolve_model

    resolved = resolve_model(spec, memo, model_cache_dir)
    memo.save()
    torch_device = resolve_device(device)
    return ModelSession(resolved, torch_device, amp, precision_name(torch_device, amp), model_cache_dir)
