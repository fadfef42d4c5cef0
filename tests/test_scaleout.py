"""Sharded encode over --task_runner threads / dask: the same cache entries, to the bit, as a single process."""

from __future__ import annotations

import numpy as np
import pytest

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.tasks.encode.sharded import plan_shards


@pytest.mark.parametrize("rows,batch,workers,shard_rows", [
    (1, 64, 2, None), (300, 32, 2, 64), (1000, 100, 3, None), (10_000, 64, 2, None), (200_000, 256, 2, None),
    (5000, 7, 4, 100), (4096, 4096, 1, None), (10, 64, 8, 1),
])
def test_shard_plan_covers_rows_on_batch_and_chunk_boundaries(rows, batch, workers, shard_rows):
    plan = plan_shards(rows, batch, workers, shard_rows)
    starts = [lo for lo, _ in plan.shards]
    assert plan.shards[0][0] == 0 and plan.shards[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(plan.shards, plan.shards[1:], strict=False))  # contiguous, no overlap
    assert all(lo % batch == 0 for lo in starts)  # same batches as one process
    assert all(lo % plan.chunk_rows == 0 for lo in starts)  # no chunk shared by two shards
    assert plan.chunk_rows % batch == 0 and (plan.chunk_rows <= 4096 or plan.chunk_rows == batch)
    assert max(hi - lo for lo, hi in plan.shards) <= 65_536 or batch > 65_536


def _entries(root) -> dict[str, dict[str, np.ndarray]]:
    store = EmbeddingStore(root)
    out = {}
    for key in store.keys():
        entry = store.open(key)
        out[key] = {name: entry.array(name) for name in entry._group.array_keys()}
        out[key]["chunk_seals"] = np.array(entry.attrs["chunk_seals"])
        assert store.verify(key) == []
    return out


def _assert_same_entries(a, b) -> None:
    ea, eb = _entries(a), _entries(b)
    assert sorted(ea) == sorted(eb) and ea
    for key in ea:
        assert sorted(ea[key]) == sorted(eb[key])
        for name in ea[key]:
            np.testing.assert_array_equal(ea[key][name], eb[key][name], err_msg=f"{key[:12]} {name}")
            assert ea[key][name].dtype == eb[key][name].dtype


# 72 images (two shards of 48 rows at most; the last batch has 8 rows and is encoded on a worker) and 132 distinct
# captions (three shards; the last ends in a 4-row batch, so the flow encodes it: scaleout._tiny_last_batch): every
# path a larger run takes, with 6 shard task runs on the workers instead of the 17 that 200 images took.
BASE = {"models": [{"model_name": "tiny-shapes-clip"}], "datasets": ["shapes", "shapes_retrieval"], "limit": 72,
        "batch_size": 16, "verbose": False}


@pytest.fixture(scope="module")
def single_process(tmp_path_factory, prefect_server):
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate

    root = tmp_path_factory.mktemp("single")
    results = evaluate(EvaluateParams(**BASE, cache_dir=str(root / "cache"), output_dir=str(root / "out")))
    return root / "cache", results


def test_threads_runner_writes_the_single_process_entries(prefect_server, single_process, tmp_path):
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate

    params = EvaluateParams(**BASE, cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "out"),
                            task_runner="threads", workers=2, shard_rows=48)
    results = evaluate(params)
    assert [r.metrics for r in results] == [r.metrics for r in single_process[1]]
    _assert_same_entries(single_process[0], tmp_path / "cache")
    again = evaluate(params)
    assert all(r.cache_hit and not r.model_loaded for r in again)


def test_interrupted_sharded_encode_redoes_only_missing_shards(prefect_server, single_process, tmp_path,
                                                               monkeypatch):
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate
    from clipcache.storage.errors import ClipcacheError
    from clipcache.tasks.encode import sharded

    params = EvaluateParams(**{**BASE, "datasets": ["shapes"]}, cache_dir=str(tmp_path / "cache"),
                            output_dir=str(tmp_path / "out"), task_runner="threads", workers=2, shard_rows=32)
    real = sharded.encode_shard
    calls: list[int] = []

    def crash_on_third(job):  # image shards 0-32 and 32-64 start first (two threads), then 64-72 fails
        calls.append(job.lo)
        if job.lo == 64:
            raise ClipcacheError("worker lost")
        return real(job)

    from clipcache.flows.orchestration.scaleout import shard_tasks

    encode_shard_task = shard_tasks()[0]
    monkeypatch.setattr(sharded, "encode_shard", crash_on_third)
    monkeypatch.setattr(encode_shard_task, "fn", crash_on_third)
    with pytest.raises(ClipcacheError, match="worker lost"):
        evaluate(params)
    store = EmbeddingStore(tmp_path / "cache")
    assert store.keys() == [] or all(store.open(k).attrs["kind"] != "image" for k in store.keys())
    done_before = set(calls) - {64}

    calls.clear()
    monkeypatch.setattr(encode_shard_task, "fn", lambda job: (calls.append(job.lo), real(job))[1])
    result = evaluate(params)[0]
    assert result.resumed and 64 in calls
    assert not (set(calls) & done_before), "finished shards were encoded again"
    assert result.metrics == single_process[1][0].metrics
    image = [k for k in store.keys() if store.open(k).attrs["kind"] == "image"]
    ref = EmbeddingStore(single_process[0])
    ref_image = [k for k in ref.keys() if ref.open(k).attrs["kind"] == "image" and ref.open(k).count == BASE["limit"]]
    np.testing.assert_array_equal(store.open(image[0]).embeddings(), ref.open(ref_image[0]).embeddings())


# What a worker imports for its first shard (the task's module, Prefect's task engine, the model's library), imported
# when the worker process starts instead (Dask's distributed.worker.preload, `dask worker --preload`): both workers
# import at once while the flow starts, instead of one after the other on their first task. The same modules are
# still imported in each fresh worker interpreter.
WORKER_PRELOAD = ["clipcache.tasks.encode.sharded", "prefect.task_engine", "open_clip"]


@pytest.mark.slow
def test_dask_local_cluster_with_two_workers_matches_single_process(prefect_server, single_process, tmp_path):
    """Two Dask worker processes (one torch thread each) against one process with the default threads."""
    import dask
    import distributed  # noqa: F401 (its config defaults first: leaving dask.config.set then restores only the key)

    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate

    params = EvaluateParams(**BASE, cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "out"),
                            task_runner="dask", workers=2, shard_rows=48)
    with dask.config.set({"distributed.worker.preload": WORKER_PRELOAD}):  # the nanny hands its config to its worker
        results = evaluate(params)
    assert [r.metrics for r in results] == [r.metrics for r in single_process[1]]
    _assert_same_entries(single_process[0], tmp_path / "cache")


def test_task_runner_values_are_checked():
    from clipcache.flows.config.params import EvaluateParams, validate
    from clipcache.storage.errors import ConfigError

    for good in ("none", "threads", "dask", "dask://10.0.0.5:8786", "tcp://sched:8786"):
        assert validate(EvaluateParams, {**BASE, "task_runner": good}).task_runner == good
    with pytest.raises(ConfigError, match="task_runner: .*got 'ray'"):
        validate(EvaluateParams, {**BASE, "task_runner": "ray"})


@pytest.mark.parametrize("bad,batch_size", [([4], 16), ([4, 5, 6, 7], 4)], ids=["one-image", "a-whole-shard"])
def test_sharded_skip_of_corrupt_images_equals_single_process(prefect_server, tmp_path, bad, batch_size):
    """Skipped rows leave a gap in their shard's region (or fill it); publishing closes it exactly as one process
    would."""
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate
    from clipcache.storage.errors import DatasetError

    from conftest import replace_tar_member, write_wds

    root = write_wds(tmp_path / "d", "classification", 40, shards=2, fmt="png")
    for i in bad:
        replace_tar_member(root / "test" / "0.tar", f"s{i:06d}.png", b"\x89PNG garbage")
    base = {**BASE, "datasets": ["wds/d"], "dataset_root": str(root), "limit": None, "on_bad_image": "skip",
            "batch_size": batch_size}
    sharding = {"task_runner": "threads", "workers": 2, "shard_rows": batch_size}
    single = evaluate(EvaluateParams(**base, cache_dir=str(tmp_path / "c1"), output_dir=str(tmp_path / "o1")))
    sharded = evaluate(EvaluateParams(**base, cache_dir=str(tmp_path / "c2"), output_dir=str(tmp_path / "o2"),
                                      **sharding))
    assert sharded[0].metrics == single[0].metrics and single[0].metrics["skipped_images"] == len(bad)
    _assert_same_entries(tmp_path / "c1", tmp_path / "c2")
    with pytest.raises(DatasetError, match=f"s{bad[0]:06d}.png"):
        evaluate(EvaluateParams(**{**base, "on_bad_image": "error"}, cache_dir=str(tmp_path / "c3"),
                                output_dir=str(tmp_path / "o3"), **sharding))


def _wait_listening(port: int, proc, timeout: float = 180.0) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"dask scheduler not listening on {port} (exit code {proc.poll()})")


@pytest.mark.slow
def test_existing_dask_scheduler_by_address(prefect_server, single_process, tmp_path):
    """`dask scheduler` + `dask worker` processes started on their own, reached as dask://127.0.0.1:PORT; the
    worker reports its task runs to the same Prefect API as the flow (PREFECT_API_URL), as a deployment would. One
    worker process with two threads (each worker process imports torch; results from several worker processes are
    test_dask_local_cluster_with_two_workers_matches_single_process's)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    import prefect.settings

    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value(),
           "DASK_LOGGING__DISTRIBUTED": "warning"}
    # Both at once (the worker retries until the scheduler listens), and no nanny: the worker is this process
    # itself, not a child a nanny process spawns (one interpreter start and one import of Dask fewer). It gets the
    # thread settings a nanny gives its worker (dask's distributed.nanny.pre-spawn-environ).
    threads = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    procs = [subprocess.Popen([str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
             subprocess.Popen([str(bin_dir / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--no-nanny",
                               "--nthreads", "2", "--no-dashboard", "--host", "127.0.0.1",
                               *(arg for module in WORKER_PRELOAD for arg in ("--preload", module))],
                              env={**env, **threads},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait_listening(port, procs[0])  # a slow start is not an unreachable scheduler (the client waits 30 s)
        params = EvaluateParams(**BASE, cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "out"),
                                task_runner=f"dask://127.0.0.1:{port}", shard_rows=48)
        results = evaluate(params)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
    assert [r.metrics for r in results] == [r.metrics for r in single_process[1]]
    _assert_same_entries(single_process[0], tmp_path / "cache")


def test_unreachable_scheduler_is_one_clear_error(prefect_server, tmp_path, capsys, monkeypatch):
    """The CLI reports to the test's Prefect API (PREFECT_API_URL, as a configured user's would) instead of starting
    a private server (tests/test_launch.py), and gives up on the scheduler after dask's own connect timeout."""
    import dask
    import prefect.settings

    from clipcache.flows.cli import main

    monkeypatch.setenv("PREFECT_API_URL", prefect.settings.PREFECT_API_URL.value())
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "8", "--quiet",
                     "--task_runner", "dask://127.0.0.1:9", "--cache_dir", str(tmp_path / "c"),
                     "--output_dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 1 and "cannot reach the workers" in err and "Traceback" not in err
