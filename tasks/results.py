"""Turn one evaluation's metrics into result files: evalscope JSON, clip_benchmark JSON, long-format Parquet rows."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from clipcache.storage.errors import ConfigError
from clipcache.storage.paths import as_path
from clipcache.storage.results import json_safe_metrics, write_json, write_metric_rows
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.metrics import split_metric_name


def clipcache_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("clipcache")
    except PackageNotFoundError:
        return "0+unknown"


def dataset_slug(name: str) -> str:
    return name.replace("/", "_")


def evalscope_result_path(output_dir: str | Path, spec: ModelSpec, dataset: str, task: str) -> Path:
    """``<output_dir>/<model basename>/<dataset>_<task>.json`` (evalscope's layout)."""
    return as_path(output_dir) / spec.basename / f"{dataset_slug(dataset)}_{task}.json"


def clip_benchmark_output_path(template: str, spec: ModelSpec, dataset: str, task: str, language: str) -> Path:
    """clip_benchmark's ``--output`` template fields: model, pretrained, pretrained_full_path, task, dataset, language."""
    pretrained = spec.pretrained or ""
    is_file = bool(pretrained) and os.path.isfile(pretrained)
    bare = dataset[len("wds/"):] if dataset.startswith("wds/") else dataset
    try:
        return as_path(template.format(
            model=spec.model_name.replace("/", "_"), pretrained=os.path.basename(pretrained) if is_file else pretrained,
            pretrained_full_path=pretrained.replace("/", "_"), task=task, dataset=dataset_slug(bare),
            language=language))
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"output: {template!r} is not a valid template (placeholders: {{model}}, {{pretrained}}, "
                          f"{{pretrained_full_path}}, {{task}}, {{dataset}}, {{language}})") from e


@dataclass
class PairContext:
    run_id: str
    created_at: datetime
    spec: ModelSpec
    model_fingerprint: str
    dataset: str
    split: str
    language: str
    task: str


def metric_rows(ctx: PairContext, metrics: dict[str, float], n_samples: int, cache_keys: list[str]) -> list[dict]:
    rows = []
    for flat, value in metrics.items():
        info, k = split_metric_name(flat)
        rows.append({
            "run_id": ctx.run_id, "created_at": ctx.created_at, "model": ctx.spec.model_name,
            "pretrained": ctx.spec.pretrained, "model_fingerprint": ctx.model_fingerprint, "dataset": ctx.dataset,
            "split": ctx.split, "language": ctx.language, "task": ctx.task, "metric": info.name, "k": k,
            "value": None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value),
            "higher_is_better": info.higher_is_better, "n_samples": n_samples, "cache_keys": cache_keys,
            "clipcache_version": clipcache_version(),
        })
    return rows


def write_pair_results(ctx: PairContext, metrics: dict[str, float], n_samples: int, cache_keys: list[str],
                       output_dir: str, output_template: str | None) -> list[Path]:
    safe = json_safe_metrics(metrics)
    paths = [write_json(evalscope_result_path(output_dir, ctx.spec, ctx.dataset, ctx.task), {
        "dataset": ctx.dataset, "model": ctx.spec.model_name, "task": ctx.task, "metrics": safe})]
    if output_template:
        path = clip_benchmark_output_path(output_template, ctx.spec, ctx.dataset, ctx.task, ctx.language)
        paths.append(write_json(path, {
            "dataset": ctx.dataset, "model": ctx.spec.model_name, "pretrained": ctx.spec.pretrained,
            "task": ctx.task, "metrics": safe, "language": ctx.language}))
    paths.append(write_metric_rows(output_dir, ctx.run_id, metric_rows(ctx, metrics, n_samples, cache_keys)))
    return paths
