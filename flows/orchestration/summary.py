"""How a run's results read, the same in the CLI's table (cli/console.py) and in the Prefect artifacts
(orchestration/artifacts.py): values rounded to 4 decimals (n/a for NaN) and one word for what the cache did."""

from __future__ import annotations

import math


def format_value(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def cache_state(result) -> str:
    if result.status == "skipped":
        return "skipped"  # its result file exists (--skip_existing)
    if result.cache_hit:
        return "cache hit"
    return "resumed" if result.resumed else "encoded"
