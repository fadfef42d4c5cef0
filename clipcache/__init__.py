"""clipcache: evaluate CLIP-style image-text models from an embedding cache.

    from clipcache import run_task
    run_task(task_cfg)   # evalscope-style dict, or a path to a JSON / YAML file

Heavy modules (torch, Prefect) are imported on first use, not on ``import clipcache``.
"""

from __future__ import annotations

from typing import Any

from clipcache._version import VERSION as __version__
from clipcache.storage.errors import CacheIntegrityError, ClipcacheError, ConfigError, DatasetError, ModelError

__all__ = ["__version__", "run_task", "connect", "ClipcacheError", "ConfigError", "DatasetError", "ModelError",
           "CacheIntegrityError"]


def run_task(task_cfg: dict[str, Any] | str) -> list[dict[str, Any]]:
    """Run an evalscope task config; returns one ``{"dataset", "model", "task", "metrics"}`` dict per pair.

    ``tool: clip_benchmark`` with ``task: image_caption`` runs the convert flow (BEIR files); ``tool: mteb`` runs
    text retrieval on its ``custom_tasks`` folders; any other clip_benchmark task the evaluate flow."""
    from clipcache.flows.orchestration import launch, runtime

    runtime.configure()
    from clipcache.flows.config.convert_params import ConvertParams
    from clipcache.flows.config.evalscope import parse_task_config

    out: list[dict[str, Any]] = []
    for params in parse_task_config(task_cfg):  # every run is validated before the first starts
        if isinstance(params, ConvertParams):
            out += launch.convert(params)
            continue
        out += [{"dataset": r.dataset, "model": r.model, "task": r.task, "metrics": r.metrics, "status": r.status}
                for r in launch.evaluate(params, cached_only=False)]
    return out


def connect(output_dir: str = "outputs"):
    """A DuckDB connection with the views ``leaderboard``, ``metrics``, ``metrics_all``, ``runs``, ``samples`` and
    ``latest_samples`` over the results under ``output_dir`` (storage/warehouse.py), and the suites' table and views
    ``suite_datasets``, ``suite_results``, ``suite_scores`` (tasks/suites/sql.py)."""
    from clipcache.storage.warehouse import connect as _connect
    from clipcache.tasks.suites.sql import register

    con = _connect(output_dir)
    register(con)
    return con
