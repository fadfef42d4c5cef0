"""The ``evaluate`` and ``rescore`` flows: for each (model, dataset) pair, encode what the cache lacks (evaluate) or
insist that it is all cached (rescore), score, write results.

Pairs run in order in one process so a model is loaded once for all its datasets, and only if something must be
encoded. A pair that fails stops the run with its error; everything finished before it is already in the cache and
the result files, so re-running continues where it stopped. Results are written as each pair completes.
"""

from __future__ import annotations

import platform
import shlex
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from clipcache.flows import runtime

runtime.configure()

from prefect import flow  # noqa: E402

from clipcache.flows.artifacts import publish_evaluation  # noqa: E402
from clipcache.flows.params import EvaluateParams  # noqa: E402
from clipcache.flows.scaleout import ShardedEncoder, open_task_runner  # noqa: E402
from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402
from clipcache.storage.errors import ClipcacheError  # noqa: E402
from clipcache.storage.hashing import FileHashMemo  # noqa: E402
from clipcache.storage.paths import local_dir  # noqa: E402
from clipcache.storage.results import new_run_id, write_run_row  # noqa: E402
from clipcache.tasks import prefect_tasks as t  # noqa: E402
from clipcache.tasks.datasets.languages import localize  # noqa: E402
from clipcache.tasks.encode.sharded import DatasetSource  # noqa: E402
from clipcache.tasks.encode.stage import caption_key_fields, image_key_fields  # noqa: E402
from clipcache.tasks.evaluation import CacheMissError, EncodeOptions  # noqa: E402
from clipcache.tasks.progress import StageProgress  # noqa: E402
from clipcache.tasks.results import PairContext, clipcache_version, evalscope_result_path  # noqa: E402


@dataclass
class PairResult:
    model: str
    dataset: str
    task: str
    metrics: dict[str, float] = field(default_factory=dict)
    n_samples: int = 0
    status: str = "done"  # done | skipped
    cache_hit: bool = False
    resumed: bool = False
    model_loaded: bool = False
    encode_seconds: float = 0.0
    score_seconds: float = 0.0
    files: list[str] = field(default_factory=list)
    run_id: str = ""


@flow(name="evaluate", flow_run_name="evaluate-{params.datasets[0]}", validate_parameters=True, log_prints=False)
def evaluate(params: EvaluateParams) -> list[PairResult]:
    """Encode what the cache lacks, then score every (model, dataset) pair."""
    return run_pairs(params, cached_only=False)


@flow(name="rescore", flow_run_name="rescore-{params.datasets[0]}", validate_parameters=True, log_prints=False)
def rescore(params: EvaluateParams) -> list[PairResult]:
    """Recompute metrics from cached embeddings only: never decodes an image; loads the model only to encode class
    prompts it has never seen (new templates or class names), and says which `clipcache eval` fills any gap."""
    return run_pairs(params, cached_only=True)


def run_pairs(params: EvaluateParams, cached_only: bool) -> list[PairResult]:
    run_id, results = _run_pairs(params, cached_only)
    publish_evaluation("rescore" if cached_only else "evaluate", run_id, results, params.output_dir)
    return results


def _run_pairs(params: EvaluateParams, cached_only: bool) -> tuple[str, list[PairResult]]:
    progress = StageProgress(enabled=params.verbose)
    run_id, created_at, started = new_run_id(), datetime.now(UTC), time.perf_counter()
    store = EmbeddingStore(params.cache_dir)
    memo = FileHashMemo(local_dir(params.cache_dir) / "file_hashes.json")
    opts = EncodeOptions(params.batch_size, params.num_workers, params.on_bad_image, params.limit, cached_only)
    results: list[PairResult] = []
    status, device = "failed", "unknown"
    try:
        with open_task_runner("none" if cached_only else params.task_runner, params.workers) as runner:
            encoder = ShardedEncoder(runner, store, params, progress) if runner is not None else None
            for spec in params.models:
                session = t.prepare_model(spec, memo, params.device, params.amp, params.model_cache_dir)
                device = str(session.device)
                for name in params.datasets:
                    result = _evaluate_pair(params, spec, session, name, store, memo, opts, progress, run_id,
                                            created_at, encoder)
                    result.run_id = run_id
                    results.append(result)
        status = "completed"
        return run_id, results
    finally:
        write_run_row(params.output_dir, {
            "run_id": run_id, "created_at": created_at, "finished_at": datetime.now(UTC), "status": status,
            "config": params.model_dump_json(), "device": device,
            "versions": library_versions(),
            "durations": {"total_seconds": time.perf_counter() - started,
                          "pairs": [{"model": r.model, "dataset": r.dataset, "encode_seconds": r.encode_seconds,
                                     "score_seconds": r.score_seconds} for r in results]},
            "clipcache_version": clipcache_version(),
        })


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("clipcache", "torch", "open_clip_torch", "transformers", "prefect", "zarr", "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def _evaluate_pair(params, spec, session, name, store, memo, opts, progress, run_id, created_at,
                   encoder: ShardedEncoder | None = None) -> PairResult:
    if params.task == "text_retrieval":
        return _text_retrieval_pair(params, spec, session, name, store, memo, progress, run_id, created_at)
    if params.skip_existing and params.task != "auto":
        existing = evalscope_result_path(params.output_dir, spec, name, params.task)
        if existing.exists():
            return PairResult(spec.model_name, name, params.task, status="skipped", files=[str(existing)])
    dataset = t.open_dataset(name, params.dataset_root, params.split, params.limit, params.hub,
                             str(local_dir(params.cache_dir)), params.offline, progress)
    task = t.select_task(dataset, params.task)
    if task == "zeroshot_classification":
        dataset.prompts = localize(dataset.prompts, name, params.language)
        if params.classnames or params.templates:
            dataset.prompts = dataset.prompts.override(params.classnames, params.templates, name)
    existing = evalscope_result_path(params.output_dir, spec, name, task)
    if params.skip_existing and existing.exists():
        return PairResult(spec.model_name, name, task, status="skipped", files=[str(existing)])
    loads_before = session.loads
    shard_started = time.perf_counter()
    sharded = _encode_sharded(encoder, params, session, dataset, name, task, memo) if encoder else {}
    shard_seconds = time.perf_counter() - shard_started
    try:
        encoded = t.encode(session, dataset, task, store, memo, opts, progress, sharded)
    except CacheMissError as e:
        raise ClipcacheError(f"{e}. Fill it with:\n  {eval_command(params, spec, name)}") from e
    scored = t.score(store, encoded, params.recall_k, tuple(params.retrieval_metrics))
    ctx = PairContext(run_id, created_at, spec, session.resolved.fingerprint, name, params.split, params.language,
                      task)
    files = t.write_results(ctx, scored.metrics, scored.n_samples, encoded.cache_keys, params.output_dir,
                            params.output)
    loaded = session.loads > loads_before or bool(sharded)  # sharded: the workers loaded it
    return PairResult(spec.model_name, name, task, scored.metrics, scored.n_samples, "done", encoded.cache_hit,
                      encoded.resumed, loaded, encoded.seconds + shard_seconds, scored.seconds,
                      [str(f) for f in files])


def _encode_sharded(encoder: ShardedEncoder, params, session, dataset, name, task, memo) -> dict:
    """Images (and captions) of one pair over the task runner; what is cached already is left to ``t.encode``."""
    identity = dataset.identity(memo)
    memo.save()
    source = DatasetSource(name, params.dataset_root, params.split, params.limit, params.hub,
                           str(local_dir(params.cache_dir)), params.offline, identity)
    roles = {"image": image_key_fields(session, identity, dataset.split, params.limit)}
    if task == "zeroshot_retrieval":
        roles["caption"] = caption_key_fields(session, identity, dataset.split, params.limit)
    done = {role: encoder.encode(session, dataset, source, role, fields) for role, fields in roles.items()}
    return {role: outcome for role, outcome in done.items() if outcome is not None}


def _text_retrieval_pair(params, spec, session, name, store, memo, progress, run_id, created_at) -> PairResult:
    """A BEIR folder (``dataset_root``, a template with {dataset} allowed) searched with a text model."""
    from clipcache.tasks.datasets import format_root
    from clipcache.tasks.text_retrieval import encode_beir, open_beir, score_beir

    task = "text_retrieval"
    existing = evalscope_result_path(params.output_dir, spec, name, task)
    if params.skip_existing and existing.exists():
        return PairResult(spec.model_name, name, task, status="skipped", files=[str(existing)])
    if not params.dataset_root:
        raise ClipcacheError("text_retrieval needs --dataset_root: a BEIR folder (corpus.jsonl, queries.jsonl, "
                             "qrels/<split>.tsv), e.g. outputs/<captioner>/<dataset>/retrieval_data")
    data = open_beir(name, format_root(params.dataset_root, name), params.split, params.limit)
    loads_before = session.loads
    encoded = encode_beir(session, data, store, memo, params.batch_size, params.limit, progress)
    started = time.perf_counter()
    metrics = score_beir(store, encoded, data, sorted(set(params.recall_k) | {10}))
    score_seconds = time.perf_counter() - started
    ctx = PairContext(run_id, created_at, spec, session.resolved.fingerprint, name, params.split, params.language,
                      task)
    files = t.write_results(ctx, metrics, len(data.query_ids), encoded.cache_keys, params.output_dir, params.output)
    return PairResult(spec.model_name, name, task, metrics, len(data.query_ids), "done", encoded.cache_hit, False,
                      session.loads > loads_before, encoded.seconds, score_seconds, [str(f) for f in files])


def eval_command(params: EvaluateParams, spec, dataset: str) -> str:
    """The `clipcache eval` invocation that encodes what a rescore of (spec, dataset) needs."""
    args = ["clipcache", "eval", "--model", spec.model_name]
    optional = [("--pretrained", spec.pretrained), ("--model_type", None if spec.model_type == "auto" else
                                                     spec.model_type),
                ("--arch_config", spec.arch_config), ("--dataset", dataset), ("--dataset_root", params.dataset_root),
                ("--split", None if params.split == "test" else params.split),
                ("--limit", params.limit), ("--cache_dir", None if params.cache_dir == "cache" else params.cache_dir)]
    for flag, value in optional:
        if value is not None:
            args += [flag, str(value)]
    if params.amp:
        args.append("--amp")
    return shlex.join(args)
