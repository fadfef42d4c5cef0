"""Sharded encode on a local Dask cluster: 2 workers vs 1 worker on the same data, side by side in one run.

    .venv/bin/python benchmarks/sharded_encode.py [--images 640] [--model ViT-B-32] [--shards 8]

Encodes the images of the generated shapes dataset with a ViT-B-32-sized open_clip model (random, seeded weights;
compute-bound on a CPU) through ``--task_runner dask``: every worker is a process with one torch thread. Reports:

- encode time with 1 and 2 workers (same shards) and their ratio (target >= 1.6x on 2 cores);
- the overhead per shard: 1 worker encoding the data as ``--shards`` shards vs as one shard;
- the cluster start-up time, paid once per flow run.

Each configuration writes a fresh cache; the entries are compared to the bit at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clipcache.flows.orchestration import runtime  # noqa: E402

runtime.configure()  # before Prefect is imported: offline, quiet, project-local state

import numpy as np  # noqa: E402
from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from clipcache.flows.config.params import EvaluateParams  # noqa: E402
from clipcache.flows.orchestration.scaleout import ShardedEncoder, open_task_runner  # noqa: E402
from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402
from clipcache.storage.hashing import FileHashMemo  # noqa: E402
from clipcache.tasks.encode.sharded import plan_shards  # noqa: E402
from clipcache.tasks.encode.stage import ModelSession, image_key_fields  # noqa: E402
from clipcache.tasks.evaluation.base import DataSource, Prepared  # noqa: E402
from clipcache.tasks.models.resolve import resolve_model  # noqa: E402
from clipcache.tasks.models.spec import ModelSpec  # noqa: E402
from clipcache.tasks.progress import StageProgress  # noqa: E402


@task(name="noop", cache_policy=NO_CACHE)
def _noop() -> None:
    return None


@flow(name="bench-sharded-encode")
def sharded_encode(model: str, images: int, workers: int, shard_rows: int, cache: str) -> dict:
    import torch

    params = EvaluateParams(models=[{"model_name": model}], datasets=["shapes"], limit=images, batch_size=32,
                            task_runner="dask", workers=workers, shard_rows=shard_rows, cache_dir=cache,
                            verbose=False)
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name=model), memo), torch.device("cpu"), False, "fp32")
    source = DataSource("shapes", None, "test", images)
    dataset = source.open()
    identity = dataset.identity(memo)
    prepared = Prepared(dataset, len(dataset), source)
    store = EmbeddingStore(cache)
    started = time.perf_counter()
    with open_task_runner("dask", workers) as runner:
        settings = params.run_settings(cached_only=False).encode
        encoder = ShardedEncoder(runner, store, settings, StageProgress(enabled=False), task_runner="dask",
                                 workers=workers, shard_rows=shard_rows, device=params.device,
                                 model_cache_dir=None)
        # the cluster starts on the first submission: time it with a no-op probe of the workers
        runner.submit(_noop, parameters={}).result()
        ready = time.perf_counter()
        outcome = encoder.encode(session, dataset, prepared, identity, "image",
                                 image_key_fields(session, identity, "test", images))
        done = time.perf_counter()
    return {"startup": ready - started, "encode": done - ready, "key": outcome.ref.key}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=640)
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()
    per_shard = -(-args.images // args.shards)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "1 worker, 1 shard": (1, args.images),
            "1 worker": (1, per_shard),
            "2 workers": (2, per_shard),
        }
        out = {}
        for label, (workers, shard_rows) in runs.items():
            out[label] = sharded_encode(args.model, args.images, workers, shard_rows, f"{tmp}/{label}")
            print(f"{label:>18}: cluster start {out[label]['startup']:5.1f} s, encode {out[label]['encode']:6.1f} s "
                  f"({args.images / out[label]['encode']:.1f} img/s)", flush=True)
        vectors = {label: EmbeddingStore(f"{tmp}/{label}").open(r["key"]).embeddings() for label, r in out.items()}
        identical = all(np.array_equal(vectors["1 worker, 1 shard"], v) for v in vectors.values())
    one, two = out["1 worker"]["encode"], out["2 workers"]["encode"]
    plan = plan_shards(args.images, 32, 1, per_shard)  # what the runs used (shards start on batch boundaries)
    n_shards = len(plan.shards)
    per_shard_overhead = (one - out["1 worker, 1 shard"]["encode"]) / (n_shards - 1)
    print(f"\n{args.images} images, {args.model} (random weights), fp32, batch 32, {n_shards} shards of "
          f"{plan.shards[0][1]} rows")
    print(f"2 workers vs 1 worker: {one / two:.2f}x faster encode (target >= 1.6x)")
    print(f"overhead per shard: {per_shard_overhead * 1000:.0f} ms ({n_shards} shards vs 1 on one worker)")
    print(f"identical vectors in all three runs: {identical}")


if __name__ == "__main__":
    main()
