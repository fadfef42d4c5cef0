"""The evaluation pipeline, written once: for each model, dataset and language, prepare, encode, score, write.

It runs under a Prefect flow (flows/orchestration/flows.py) or as plain calls (flows/orchestration/launch.py); see flows/orchestration/stages.py. Pairs run in
order in one process, so a model is loaded once for all its datasets, and only if something must be encoded. A pair
that fails stops the run with its error; what finished before it is already in the cache and the result files, so
re-running continues where it stopped. The run row, written last, commits the run: only the metric rows of completed
runs count in the warehouse's views.
"""

from __future__ import annotations

import logging
import platform
import shlex
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.flows.config.params import EvaluateParams
from clipcache.flows.config.run_settings import Evaluation, RunSettings
from clipcache.flows.orchestration.stages import Stages
from clipcache.storage import faults
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import ClipcacheError, ConfigError
from clipcache.storage.experiment import Experiment
from clipcache.storage.hashing import FileHashMemo
from clipcache.storage.paths import check_location, local_dir
from clipcache.storage.results import new_run_id, write_run_row
from clipcache.tasks.contract import CacheMissError, DataSource, ScoreSettings, TaskOptions
from clipcache.tasks.evaluation import get_task
from clipcache.tasks.evaluation.base import EvalTask
from clipcache.tasks.identity import experiment_for, full_when_untruncated
from clipcache.tasks.models.api_spec import ApiFields
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.progress import StageProgress
from clipcache.tasks.results import RunInfo, clipcache_version, existing_result, write_pair_results

if TYPE_CHECKING:
    from clipcache.flows.orchestration.scaleout import ShardedEncoder
    from clipcache.tasks.encode.stage import ModelSession

log = logging.getLogger("clipcache.flow")


@dataclass
class PairResult:
    model: str
    dataset: str
    task: str
    pretrained: str | None = None
    language: str = "en"
    metrics: dict[str, float] = field(default_factory=dict)
    tied: dict[str, int] = field(default_factory=dict)
    intervals: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # metric -> 95% interval
    n_samples: int = 0
    status: str = "done"  # done | skipped
    cache_hit: bool = False
    resumed: bool = False
    model_loaded: bool = False
    encode_seconds: float = 0.0
    score_seconds: float = 0.0
    files: list[str] = field(default_factory=list)
    run_id: str = ""
    experiment_id: str = ""
    variant: str = ""  # the task settings that tell this result apart when a run asks for several (fewshot_k=5)
    split: str = "test"


@dataclass(kw_only=True)
class RunContext:
    """What every pair of one run shares: typed settings (not the parameter model) and the open stores."""

    settings: RunSettings
    stages: Stages
    run: RunInfo
    store: EmbeddingStore
    memo: FileHashMemo
    progress: StageProgress
    encoder: ShardedEncoder | None = None  # when --task_runner shards encoding
    # experiment id -> the pair that took it: one set of weights named twice (a file and its copy) is one experiment,
    # and a second set of its rows in this run would break the (run, experiment, metric, k) grain
    seen: dict[str, str] = field(default_factory=dict)


@dataclass
class RunOutcome:
    run_id: str
    results: list[PairResult]
    status: str
    device: str


def prepare_model(spec: ModelSpec, memo: FileHashMemo, device: str, amp: bool, model_cache_dir: str | None,
                  progress: StageProgress | None = None, *, decode: str = "cpu") -> Any:
    """A session for ``spec``: its identity resolved, its device chosen; weights load on first encode."""
    from clipcache.tasks.encode.stage import ModelSession
    from clipcache.tasks.models.devices import effective_amp, precision_name, resolve_device
    from clipcache.tasks.models.resolve import resolve_model

    resolved = resolve_model(spec, memo, model_cache_dir)
    memo.save()
    torch_device = resolve_device(device)
    amp = effective_amp(torch_device, amp)
    return ModelSession(resolved, torch_device, amp, precision_name(torch_device, amp), model_cache_dir,
                        progress=progress, decode=decode)


def choose_task(task: str, dataset: str, dataset_root: str | None) -> EvalTask:
    """``task``, or with ``auto`` the dataset's own."""
    from clipcache.tasks.datasets import default_task

    return get_task(default_task(dataset, dataset_root) if task == "auto" else task)


def evaluate_pair(ctx: RunContext, spec: ModelSpec, session: ModelSession, evaluation: Evaluation) -> list[PairResult]:
    """One (model, dataset, split, language): prepare, encode once, then score and write each variant the run asks
    for (several --fewshot_k values: one experiment each, over the same cache entries)."""
    shared, stages = ctx.settings, ctx.stages
    dataset, language = evaluation.dataset, evaluation.language
    task = choose_task(shared.task, dataset, shared.source.root)
    label = f"{spec.display_name}{'@' + session.resolved.checkpoint_label if session.resolved.checkpoint_label else ''}"
    where = f"{label}-{dataset}" + "".join(f"-{value}" for value, several in (
        (evaluation.split, len({e.split for e in shared.evaluations}) > 1),
        (language, len({e.language for e in shared.evaluations}) > 1)) if several)
    source = replace(shared.source, name=dataset, split=evaluation.split, language=language)
    prompts = replace(shared.prompts, language=language)
    prepared = stages.run("prepare", f"prepare-{where}", task.prepare, source, prompts, ctx.progress)
    prepared = full_when_untruncated(task, prepared, prompts, ctx.progress)
    # one set of options per variant the run asks for (several --fewshot_k values for a task that reads it)
    options = shared.options.for_task(task.Options)
    results: list[PairResult] = []
    pending: list[tuple[PairResult, Experiment, ScoreSettings, str]] = []
    variants: dict[str, tuple[Experiment, ScoreSettings]] = {}
    for chosen in options:
        settings = replace(shared.score, device=str(session.device), options=chosen)
        experiment = experiment_for(spec, session, task, prepared, settings)
        variants.setdefault(experiment.id, (experiment, settings))
    swept = [k for k in task.Options.model_fields if len({getattr(s.options, k) for _, s in variants.values()}) > 1]
    for experiment, settings in variants.values():
        variant = ",".join(f"{k}={getattr(settings.options, k)}" for k in swept)
        name = where + (f"-{variant}" if variant else "")
        result = PairResult(spec.display_name, dataset, task.name, experiment.pretrained, language,
                            experiment_id=experiment.id, run_id=ctx.run.run_id, variant=variant,
                            split=evaluation.split)
        results.append(result)
        if (first := ctx.seen.get(experiment.id)) is not None:
            log.info("%s: skipped, same experiment as %s", name, first)
            result.status = "skipped"
            continue
        ctx.seen[experiment.id] = name
        output = shared.output
        if output.skip_existing and (found := existing_result(experiment, output.output_dir)) is not None:
            log.info("%s: skipped, %s exists", name, found)
            result.status, result.files = "skipped", [str(found)]
            continue
        pending.append((result, experiment, settings, name))
    if not pending:
        return results
    loads_before = session.loads
    sharded: dict[str, Any] = {}
    started = time.perf_counter()
    if ctx.encoder is not None:
        sharded = ctx.encoder.encode_pair(session, task, prepared, ctx.memo)
    # variants differ only in options the encode step does not read (--fewshot_k): the first one's are theirs
    encode = replace(shared.encode, options=options[0])
    try:
        encoded = stages.run("encode", f"encode-{where}", task.encode, session, prepared, ctx.store, ctx.memo,
                             encode, ctx.progress, sharded=sharded)
    except CacheMissError as e:
        raise ClipcacheError(f"{e}. Fill it with:\n  {eval_command(shared, spec, source, options[0])}") from e
    encode_seconds = time.perf_counter() - started
    scores = []  # every variant is scored before any is written: a bad one (fewshot_k too large) writes nothing
    for _, _, settings, name in pending:
        with ctx.progress.status(f"scoring {dataset} on {session.device}"):
            scores.append(stages.run("score", f"score-{name}", task.score, ctx.store, encoded, prepared, settings))
    dumps = {}  # clip_benchmark's --dump_classnames / --dump_templates: the prompts this evaluation used
    if prepared.prompts is not None and shared.output.dump_classnames:
        dumps["classnames"] = list(prepared.prompts.classnames)
    if prepared.prompts is not None and shared.output.dump_templates:
        dumps["templates"] = list(prepared.prompts.templates)
    for (result, experiment, _, name), scored in zip(pending, scores, strict=True):
        files = stages.run("write-results", f"write-{name}", write_pair_results, ctx.run, spec, experiment,
                           model_fingerprint=session.resolved.fingerprint, metrics=scored.metrics, tied=scored.tied,
                           n_samples=scored.n_samples, cache_keys=encoded.cache_keys,
                           output_dir=shared.output.output_dir, output_template=shared.output.template, dumps=dumps,
                           evidence=scored.evidence)
        result.metrics, result.tied, result.n_samples = scored.metrics, scored.tied, scored.n_samples
        result.intervals = scored.evidence.all_intervals() if scored.evidence is not None else {}
        result.cache_hit, result.resumed = encoded.cache_hit, encoded.resumed
        result.model_loaded = session.loads > loads_before or bool(sharded)  # sharded: the workers loaded it
        result.encode_seconds = encode_seconds
        result.score_seconds, result.files = scored.seconds, [str(f) for f in files]
        log.info("%s: %s", name, ", ".join(f"{k}={v:.4f}" for k, v in scored.metrics.items()))
        faults.point("pair-done")
    return results


def check_prompt_files(params: EvaluateParams) -> None:
    """--classnames / --templates that no dataset of the run would read are refused before any work, not ignored:
    every dataset's task takes no class names, or the file is an object keyed by datasets none of which is run."""
    import json

    given = {what: path for what, path in (("classnames", params.classnames), ("templates", params.templates)) if path}
    if not given:
        return
    prompted = [d for d in params.datasets if choose_task(params.task, d, params.dataset_root).uses_prompts]
    for what, path in given.items():
        if not prompted:
            raise ConfigError(f"{what}: {path} would be ignored: no dataset of this run ({', '.join(params.datasets)}) "
                              f"is evaluated with class names and templates (zero-shot classification)")
        if Path(path).suffix != ".json":
            continue
        try:
            keys = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # read_text_list names the problem when the dataset is prepared
        if isinstance(keys, dict) and not set(keys) & set(prompted):
            shown = ", ".join(sorted(map(str, keys))[:8]) or "no dataset"
            raise ConfigError(f"{what}: {path} holds lists for {shown}, none of which is a dataset of this run "
                              f"({', '.join(prompted)}); the file would be ignored")


def run_evaluation(params: EvaluateParams, stages: Stages, cached_only: bool) -> RunOutcome:
    """Every (model, dataset, language) of ``params``; the run row is written last, whatever happens."""
    from clipcache.flows.orchestration.scaleout import ShardedEncoder, open_task_runner

    check_location(params.cache_dir, "cache_dir")
    check_location(params.output_dir, "output_dir")
    check_prompt_files(params)
    if params.decode == "gpu" and not cached_only:  # a rescore decodes nothing: it reads what GPU decoding cached
        from clipcache.tasks.encode.gpu_decode import check_gpu_decoding

        check_gpu_decoding(params.device)
    run = RunInfo(new_run_id(), datetime.now(UTC))
    started = time.perf_counter()
    store = EmbeddingStore(params.cache_dir)
    memo = FileHashMemo(local_dir(params.cache_dir) / "file_hashes.json")
    progress = StageProgress(enabled=params.verbose)
    results: list[PairResult] = []
    status, device = "failed", "unknown"
    sessions: list[Any] = []  # closed when the run ends: an API model prints its cost line then
    log.info("run %s: %d model(s) x %d dataset(s) x %d language(s)%s", run.run_id, len(params.models),
             len(params.datasets), len({e.language for e in params.evaluations()}),
             " (cached only)" if cached_only else "")
    try:
        with open_task_runner("none" if cached_only else params.task_runner, params.workers) as runner:
            settings = params.run_settings(cached_only)
            ctx = RunContext(settings=settings, stages=stages, run=run, store=store, memo=memo, progress=progress)
            if runner is not None:
                ctx.encoder = ShardedEncoder(runner, store, settings.encode, progress, task_runner=params.task_runner,
                                             workers=params.workers, shard_rows=params.shard_rows,
                                             device=params.device, model_cache_dir=params.model_cache_dir)
            for spec in params.models:
                session = stages.run("prepare-model", f"model-{spec.display_name}", prepare_model, spec, memo,
                                     params.device, params.amp, params.model_cache_dir, progress,
                                     decode=params.decode)
                device = str(session.device)
                sessions.append(session)
                for evaluation in settings.evaluations:
                    results.extend(evaluate_pair(ctx, spec, session, evaluation))
        status = "completed"
    finally:
        write_run_row(params.output_dir, {
            "run_id": run.run_id, "created_at": run.created_at, "finished_at": datetime.now(UTC), "status": status,
            "kind": "rescore" if cached_only else "evaluate", "config": params.model_dump_json(), "device": device,
            "versions": library_versions(),
            "durations": {"total_seconds": time.perf_counter() - started,
                          "pairs": [{"model": r.model, "dataset": r.dataset, "language": r.language,
                                     "encode_seconds": r.encode_seconds, "score_seconds": r.score_seconds}
                                    for r in results]},
            "clipcache_version": clipcache_version(),
        })
        log.info("run %s: %s in %.1f s", run.run_id, status, time.perf_counter() - started)
        for opened in sessions:
            opened.close(report=status == "completed")
    return RunOutcome(run.run_id, results, status, device)


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("clipcache", "torch", "open_clip_torch", "transformers", "prefect", "zarr", "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def eval_command(settings: RunSettings, spec: ModelSpec, source: DataSource, options: TaskOptions) -> str:
    """The `clipcache eval` invocation that encodes what a rescore of (spec, source) needs: with the task's options
    that choose what is encoded (``encode_fields``), where they differ from their defaults."""
    args = ["clipcache", "eval", "--model", spec.model_name]
    defaults = type(options).model_fields
    chosen = [(f"--{name}", None if getattr(options, name) == defaults[name].default else getattr(options, name))
              for name in options.encode_fields]
    optional = [("--pretrained", spec.pretrained),
                ("--model_type", None if spec.model_type == "auto" else spec.model_type),
                ("--arch_config", spec.arch_config),
                ("--trust_remote_code", "" if spec.trust_remote_code else None),
                # an api: model's settings as given (a key env's NAME at most: the key itself is never a field)
                *((f"--{name}", getattr(spec, name)) for name in ApiFields.model_fields),
                ("--dataset", source.name), ("--dataset_root", source.root),
                ("--split", None if source.split == "test" else source.split),
                ("--task", None if settings.task == "auto" else settings.task), *chosen,
                ("--language", None if source.language == "en" else source.language),
                ("--annotation_file", source.annotation_file),
                ("--limit", source.limit),
                ("--decode", None if settings.decode == "cpu" else settings.decode),
                ("--cache_dir", None if settings.cache_dir == "cache" else settings.cache_dir)]
    for flag, value in optional:
        if value == "":  # a switch
            args.append(flag)
        elif value is not None:
            args += [flag, str(value)]
    if settings.amp:
        args.append("--amp")
    return shlex.join(args)
