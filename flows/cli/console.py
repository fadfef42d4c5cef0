"""Console rendering of a run's results: one row per metric, the pair's details on its first row; and the one
console every command prints data through.

Names come from users and data (dataset, model, class and suite names, warehouse rows): Rich would read
``[/]x[bold]`` in one as markup and stop with a MarkupError, and turn ``[link=...]`` into a clickable link. So the
consoles that print data (:func:`data_console`) read no markup and no emoji codes at all; a style of our own is
given as a ``Text`` (:func:`styled`), never spelled inside a string.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from clipcache.flows.orchestration.summary import cache_state, format_value


def data_console(width: int | None = None, **kwargs: Any) -> Console:
    """A console that prints strings as they are (no markup, no emoji codes); ``width`` applies when the output is
    not a terminal (piped output would otherwise wrap tables at 80 columns)."""
    file = kwargs.get("file") or (sys.stderr if kwargs.get("stderr") else sys.stdout)
    terminal = hasattr(file, "isatty") and file.isatty()
    return Console(markup=False, emoji=False, width=None if terminal else width, **kwargs)


def styled(label: str, style: str, rest: str) -> Text:
    """``label`` in ``style``, then `` rest`` as plain text (whatever brackets it holds)."""
    return Text.assemble((label, style), " ", rest)


def short_task(task: str) -> str:
    from clipcache.tasks.evaluation import TASKS, get_task

    return get_task(task).short if task in TASKS else task


def format_interval(bounds: tuple[float | None, float | None] | None) -> str:
    if not bounds or bounds[0] is None or bounds[1] is None:
        return ""
    return f"{bounds[0]:.4f}-{bounds[1]:.4f}"


def print_results(console: Console, results: list, output_dir: str) -> None:
    """The results table. A ``ties`` column appears when some query's outcome was decided by a tie across the
    cut-off (clip_benchmark's torch.topk choice; see --ties)."""
    show_ties = any(any(r.tied.values()) for r in results)
    show_ci = any(getattr(r, "intervals", None) for r in results)
    show_language = len({r.language for r in results}) > 1 or any(r.language != "en" for r in results)
    show_split = len({getattr(r, "split", "test") for r in results}) > 1  # a suite that mixes splits
    table = Table(title="clipcache results")
    show_variant = any(getattr(r, "variant", "") for r in results)
    columns = [("model", "left"), ("dataset", "left"), *([("split", "left")] if show_split else []),
               *([("lang", "left")] if show_language else []),
               ("task", "left"), *([("variant", "left")] if show_variant else []), ("metric", "left"), ("value", "right"),
               *([("95% CI", "right")] if show_ci else []), *([("ties", "right")] if show_ties else []),
               ("n", "right"), ("cache", "left"), ("encode s", "right")]
    for column, justify in columns:
        table.add_column(column, justify=justify, no_wrap=column in ("model", "dataset", "task", "metric"))  # type: ignore[arg-type]
    for r in results:
        metrics = list(r.metrics.items()) or [("", None)]
        model = r.model.split("/")[-1] + (f" @ {r.pretrained}" if r.pretrained else "")
        for i, (name, value) in enumerate(metrics):
            first = i == 0
            tied = r.tied.get(name, 0)
            cells = [model if first else "", r.dataset if first else "",
                     *([r.split if first else ""] if show_split else []),
                     *([r.language if first else ""] if show_language else []),
                     short_task(r.task) if first else "",
                     *([getattr(r, "variant", "") if first else ""] if show_variant else []), name, format_value(value) if name else "",
                     *([format_interval(r.intervals.get(name))] if show_ci else []),
                     *([str(tied) if tied else ""] if show_ties else []),
                     str(r.n_samples) if first and r.n_samples else "", cache_state(r) if first else "",
                     f"{r.encode_seconds:.1f}" if first else ""]
            table.add_row(*cells, end_section=i == len(metrics) - 1)
    console.print(table)
    console.print(f"results: {output_dir}/<model>/[<pretrained>/]<dataset>_<task>[.<variant>].json; Parquet rows "
                  f"under {output_dir}/warehouse/ (clipcache query)")
    if show_ties:
        console.print("ties: queries whose hit or miss at k was decided by torch.topk among exactly tied scores, as "
                      "clip_benchmark decides it (--ties stable ranks ties by index instead)")
