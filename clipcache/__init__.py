"""clipcache: evaluate CLIP-style image-text models from an embedding cache.

    from clipcache import run_task
    run_task(task_cfg)   # evalscope-style dict, or a path to a JSON / YAML file

Heavy modules (torch, Prefect) are imported on first use, not on ``import clipcache``.
"""

from __future__ import annotations

from typing import Any

from storage.errors import CacheIntegrityError, ClipcacheError, ConfigError, DatasetError, ModelError

__all__ = ["run_task", "connect", "ClipcacheError", "ConfigError", "DatasetError", "ModelError", "CacheIntegrityError"]


def run_task(task_cfg: dict[str, Any] | str) -> list[dict[str, Any]]:
    """Run an evalscope task config; returns one ``{"dataset", "model", "task", "metrics"}`` dict per pair."""
    from flows import runtime

    runtime.configure()
    from flows.evalscope import to_evaluate_params
    from flows.evaluate import evaluate

    results = evaluate(to_evaluate_params(task_cfg))
    return [{"dataset": r.dataset, "model": r.model, "task": r.task, "metrics": r.metrics, "status": r.status}
            for r in results]


def connect(output_dir: str = "outputs"):
    """A DuckDB connection whose views ``metrics`` and ``runs`` are the results under ``output_dir``."""
    from storage.warehouse import connect as _connect

    return _connect(output_dir)
