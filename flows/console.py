"""Console rendering of a run's results: one row per metric, the pair's details on its first row."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

TASK_SHORT = {"zeroshot_classification": "classification", "zeroshot_retrieval": "retrieval"}


def format_value(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def cache_state(result) -> str:
    if result.status == "skipped":
        return "skipped"  # its result file exists (--skip_existing)
    if result.cache_hit:
        return "cache hit"
    return "resumed" if result.resumed else "encoded"


def print_results(console: Console, results: list, output_dir: str) -> None:
    table = Table(title="clipcache results")
    for column, justify in (("model", "left"), ("dataset", "left"), ("task", "left"), ("metric", "left"),
                            ("value", "right"), ("n", "right"), ("cache", "left"), ("encode s", "right")):
        table.add_column(column, justify=justify, no_wrap=column in ("model", "dataset", "task", "metric"))  # type: ignore[arg-type]
    for r in results:
        metrics = list(r.metrics.items()) or [("", None)]
        for i, (name, value) in enumerate(metrics):
            first = i == 0
            table.add_row(r.model.split("/")[-1] if first else "", r.dataset if first else "",
                          TASK_SHORT.get(r.task, r.task) if first else "", name,
                          format_value(value) if name else "", str(r.n_samples) if first and r.n_samples else "",
                          cache_state(r) if first else "", f"{r.encode_seconds:.1f}" if first else "",
                          end_section=i == len(metrics) - 1)
    console.print(table)
    console.print(f"results: {output_dir}/<model>/<dataset>_<task>.json; Parquet rows under {output_dir}/warehouse/")
