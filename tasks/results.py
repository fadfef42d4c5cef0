"""One experiment's metrics as result files: evalscope JSON, clip_benchmark JSON, long-format Parquet rows.

The row's shape is defined once, by ``storage.results.METRIC_SCHEMA``: the experiment's columns
(``Experiment.columns``), then one row per (metric, k).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from clipcache.storage.errors import ConfigError, ResultsError
from clipcache.storage.experiment import Experiment
from clipcache.storage.naming import path_component, template_problem
from clipcache.storage.paths import AnyPath, as_path, is_remote
from clipcache.storage.results import json_safe_metrics, write_json, write_metric_rows, write_sample_rows
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.metrics import MetricInfo, split_metric_name

if TYPE_CHECKING:  # numpy stays out of the CLI's start-up
    from clipcache.tasks.score.evidence import Evidence


def clipcache_version() -> str:
    """What every run and metric row records: the release, plus the source commit when known (``0.1.0+g<commit>``)."""
    from clipcache._version import full_version

    return full_version()


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    created_at: datetime


OUTPUT_FIELDS = ("model", "pretrained", "pretrained_full_path", "task", "dataset", "language")


def check_output_template(template: str) -> str:
    """clip_benchmark's ``--output`` pattern, checked before any work: plain ``{name}`` fields of
    :data:`OUTPUT_FIELDS` only (no attribute or index access, which ``str.format`` would follow)."""
    problem = template_problem(template, OUTPUT_FIELDS)
    if problem:
        raise ConfigError(f"output: {template!r} {problem}")
    return template


def check_output_location(template: str, output_dir: str, cache_dir: str | None = None) -> None:
    """ConfigError when the folder that the pattern's fixed part names (everything before its first field) lies in
    the results warehouse or an embedding cache: each field fills one path component, so no value can leave it."""
    from clipcache.storage.paths import is_url
    from clipcache.storage.warehouse import check_export_path

    if is_url(template):
        return  # an object store: no local cache or warehouse folder to land in
    # the pattern as a path: its fields are literal names under the fixed folder, which is what is checked
    check_export_path(template, output_dir, cache_dir=cache_dir, flag="output")


def clip_benchmark_output_path(template: str, spec: ModelSpec, experiment: Experiment) -> AnyPath:
    """clip_benchmark's ``--output`` template fields: model, pretrained, pretrained_full_path, task, dataset, language.
    Each value is one path component (storage/naming.py): the pattern the user wrote decides the folders, a name
    never adds any."""
    check_output_template(template)
    pretrained = spec.pretrained or ""
    is_file = bool(pretrained) and os.path.isfile(pretrained)
    dataset = experiment.dataset.removeprefix("wds/")
    values = {"model": spec.model_name.replace("/", "_"),
              "pretrained": os.path.basename(pretrained) if is_file else pretrained,
              "pretrained_full_path": pretrained.replace("/", "_"), "task": experiment.task, "dataset": dataset,
              "language": experiment.language}
    return as_path(template.format(**{k: path_component(v) if v else v for k, v in values.items()}))


def result_file_for(experiment: Experiment, output_dir: str) -> AnyPath:
    """The experiment's result file: :meth:`Experiment.result_path`, unless that file holds another experiment's
    result (two models whose names share the last component share evalscope's folder), in which case a path of
    its own (``<name>.<id prefix>.json``). One experiment's file is never replaced by another's."""
    path = experiment.result_path(output_dir)
    owner = _owner(path)
    if owner is None or owner == experiment.id or (owner == "" and experiment.is_reference):
        return path
    return experiment.alternate_result_path(output_dir)


def _clip_benchmark_identity(payload: dict) -> tuple:
    return tuple(payload.get(k) for k in ("dataset", "model", "pretrained", "task", "language"))


def _clip_benchmark_owner(path: AnyPath) -> tuple | None:
    import json

    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return _clip_benchmark_identity(saved) if isinstance(saved, dict) else None


def _owner(path: AnyPath) -> str | None:
    """The experiment id in a result file: None when there is no readable file, "" for a file without an id."""
    import json

    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return str(saved.get("experiment_id") or "") if isinstance(saved, dict) else None


def metric_rows(run: RunInfo, experiment: Experiment, *, model_fingerprint: str, metrics: dict[str, float],
                tied: dict[str, int], n_samples: int, cache_keys: list[str],
                intervals: dict[str, tuple[float | None, float | None]] | None = None,
                catalog: Mapping[str, MetricInfo] | None = None) -> list[dict]:
    """``catalog``: the metrics the task declares, as :func:`check_declared` returned it (default: built here)."""
    intervals = intervals or {}
    common = {"run_id": run.run_id, "created_at": run.created_at, **experiment.columns(),
              "model_fingerprint": model_fingerprint, "n_samples": n_samples, "cache_keys": cache_keys,
              "clipcache_version": clipcache_version()}
    if catalog is None:
        from clipcache.tasks.evaluation import metric_catalog

        catalog = metric_catalog([experiment.task])  # the metrics this task declares
    rows = []
    for flat, value in metrics.items():
        info, k = split_metric_name(flat, catalog)
        rows.append({**common, "metric": info.name, "k": k, "higher_is_better": info.higher_is_better,
                     "value": None if value is None or (isinstance(value, float) and math.isnan(value)) else
                     float(value), "tied_queries": tied.get(flat),
                     "ci_low": intervals.get(flat, (None, None))[0], "ci_high": intervals.get(flat, (None, None))[1]})
    return rows


# What --limit / evalscope's `limit` means here, written into every limited result: evalscope's numbers for the same
# limit come from other samples (whole batches), so a limited run is never compared blind.
LIMIT_RULE = ("exactly the first n samples in the dataset's order were scored (text_retrieval: the first n queries "
              "that have a relevant document, against the whole corpus). evalscope's clip_benchmark backend counts "
              "whole batches instead: for retrieval it keeps batches until it has at least n images; for "
              "classification it stops before the batch that reaches n (fewer than n images, none when n <= "
              "batch_size); its MTEB backend does not apply limits to custom tasks")


def result_payload(spec: ModelSpec, experiment: Experiment, metrics: dict[str, float],
                   n_samples: int | None = None, tied: dict[str, int] | None = None) -> dict:
    """evalscope's four keys first; then what tells this experiment apart (read back by --skip_existing), and the
    tie-sensitive queries per recall metric when a tie decided any (see --ties)."""
    payload = {"dataset": experiment.dataset, "model": spec.model_name, "task": experiment.task,
               "metrics": json_safe_metrics(metrics), "pretrained": experiment.pretrained,
               "language": experiment.language, "experiment_id": experiment.id, "experiment": experiment.as_dict()}
    if tied and any(tied.values()):
        payload["tied_queries"] = dict(tied)
    if experiment.sample_limit is not None:
        payload["limit"] = {"n": experiment.sample_limit, "scored": n_samples, "rule": LIMIT_RULE}
    return payload


def write_pair_results(run: RunInfo, spec: ModelSpec, experiment: Experiment, *, model_fingerprint: str,
                       metrics: dict[str, float], tied: dict[str, int], n_samples: int, cache_keys: list[str],
                       output_dir: str, output_template: str | None, dumps: dict | None = None,
                       evidence: Evidence | None = None) -> list[Path]:
    """``dumps``: what clip_benchmark's --dump_classnames / --dump_templates add to the JSON (classnames, templates).
    ``evidence``: the per-sample rows (written first; like the metric rows, the run row commits them) and the
    metrics' intervals (in the JSON and the metric rows)."""
    dumps = dumps or {}
    intervals = evidence.all_intervals() if evidence is not None else {}
    catalog = check_declared(experiment.task, metrics, evidence)  # a metric or sample row not declared writes nothing
    rows = metric_rows(run, experiment, model_fingerprint=model_fingerprint, metrics=metrics, tied=tied,
                       n_samples=n_samples, cache_keys=cache_keys, intervals=intervals, catalog=catalog)
    paths: list[Path] = []
    for part in evidence.parts() if evidence is not None else []:
        if part.columns:
            paths.append(write_sample_rows(output_dir, run.run_id, created_at=run.created_at,
                                           experiment_id=experiment.id, task=experiment.task, unit=part.unit,
                                           columns=part.columns, keys=part.keys))
    if evidence is not None and evidence.metadata is not None:  # once per dataset identity, for every later run
        from clipcache.storage.results import warehouse_dir
        from clipcache.storage.sample_metadata import write_sample_metadata

        if (written := write_sample_metadata(warehouse_dir(output_dir), evidence.metadata)) is not None:
            paths.append(written)
    payload = result_payload(spec, experiment, metrics, n_samples, tied)
    if intervals:
        payload["intervals"] = {name: list(bounds) for name, bounds in intervals.items()}
    paths.append(write_json(result_file_for(experiment, output_dir), {**payload, **dumps}))
    if output_template:
        payload = {"dataset": experiment.dataset, "model": spec.model_name, "pretrained": spec.pretrained,
                   "task": experiment.task, "metrics": json_safe_metrics(metrics), "language": experiment.language}
        # clip_benchmark's file has no experiment id: a pattern that maps another model, dataset, task or language
        # to an existing file gives this one a file of its own instead of replacing it.
        target = clip_benchmark_output_path(output_template, spec, experiment)
        if not is_remote(target):  # the filled pattern too: a cache found by its layout (storage/paths.py)
            from clipcache.storage.warehouse import check_export_path

            check_export_path(target, output_dir, flag="output")
        if _clip_benchmark_owner(target) not in (None, _clip_benchmark_identity(payload)):
            target = target.with_name(f"{target.stem}.{experiment.id[:8]}{target.suffix}")
        paths.append(write_json(target, {**payload, **dumps}))
    paths.append(write_metric_rows(output_dir, run.run_id, rows))
    return paths


def check_declared(task: str, metrics: dict[str, float], evidence: Evidence | None) -> dict[str, MetricInfo]:
    """What a task's ``score`` returned is what it declares: every metric (``EvalTask.metrics``, or every run's) and
    every sample row's unit and column (``EvalTask.samples``); a ``ResultsError`` in one line otherwise.
    ``evaluate_one`` checks it too, so every test that scores a task holds the task to its declarations. Returns
    the task's metric catalog it checked against (what :func:`metric_rows` names the metrics by)."""
    from clipcache.tasks.evaluation import metric_catalog

    known = metric_catalog([task])
    for flat in metrics:
        try:
            split_metric_name(flat, known)
        except KeyError:
            raise ResultsError(f"task {task} reported metric {flat!r}, which it does not declare "
                               f"(EvalTask.metrics)") from None
    if evidence is not None:
        check_sample_rows(task, evidence)
    return known


def check_sample_rows(task: str, evidence: Evidence) -> None:
    """The rows ``evidence`` holds are of units and columns ``task`` declares (``EvalTask.samples``), and those
    columns are the sample rows' (``SAMPLE_SCHEMA``); a ``ResultsError`` in one line otherwise."""
    from clipcache.storage.results import SAMPLE_SCHEMA
    from clipcache.tasks.contract import sample_rows_problem
    from clipcache.tasks.evaluation import get_task

    parts = [(part.unit, list(part.columns)) for part in evidence.parts() if part.columns]
    if problem := sample_rows_problem(task, get_task(task).samples, parts, SAMPLE_SCHEMA.names):
        raise ResultsError(problem)


def existing_result(experiment: Experiment, output_dir: str) -> AnyPath | None:
    """The result file of exactly this experiment, if one was written (``--skip_existing``): at its own path, or at
    the path of its own it got because another experiment's file was there (:func:`result_file_for`)."""
    for path in (experiment.result_path(output_dir), experiment.alternate_result_path(output_dir)):
        owner = _owner(path)
        # a file written by clipcache 0.1 has no id: it is this experiment only if it is the reference one
        if owner == experiment.id or (owner == "" and experiment.is_reference):
            return path
    return None
