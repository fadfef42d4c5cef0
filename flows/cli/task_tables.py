"""The docs' tables of task options (docs/cli.md), metrics (docs/metrics.md), sample rows and the metrics they
recompute (docs/results.md), generated from the task registry (each built-in task's ``Options``, ``metrics`` and
``samples``, and the metrics every run may report) between marker comments.
tests/test_task_options.py holds them equal to the registry. After adding or changing a built-in task, its options
or its metrics, the command that rewrites flows/cli/eval_flags.json rewrites these too:

    PYTHONPATH=$PWD .venv/bin/python -m clipcache.flows.cli.flags      # or clipcache.flows.cli.task_tables: the tables only
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
BEGIN = "<!-- generated from the task registry: {what} (python -m clipcache.flows.cli.task_tables) -->"
END = "<!-- end of generated table -->"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def options_table() -> str:
    from clipcache.flows.config.params import EvaluateParams, RunExecution, RunInputs
    from clipcache.flows.config.task_params import builtin_tasks

    tasks, run_wide = builtin_tasks(), {*RunInputs.model_fields, *RunExecution.model_fields}
    rows = ["| flag | default | tasks | meaning |", "|---|---|---|---|"]
    for name in EvaluateParams.model_fields:
        readers = [t for t in tasks if name in t.Options.model_fields]
        if not readers or name in run_wide:  # --batch_size: the run's, which linear_probe also trains with
            continue
        info = readers[0].Options.model_fields[name]
        several = " (several values: one experiment each)" if name in readers[0].Options.swept else ""
        rows.append(f"| `--{name}` | `{_default(info.default)}`{several} | {', '.join(t.name for t in readers)} | "
                    f"{_cell(info.description)} |")
    return "\n".join(rows)


def metrics_table() -> str:
    from clipcache.flows.config.task_params import builtin_tasks
    from clipcache.tasks.evaluation import metric_declarations
    from clipcache.tasks.score.metrics import merge_declarations

    rows = ["| metric | k | better | declared by | definition |", "|---|---|---|---|---|"]
    merged = merge_declarations(metric_declarations([t.name for t in builtin_tasks()]))
    for m, owners in merged.values():
        rows.append(f"| `{m.name}` | {'yes' if m.has_k else ''} | {'higher' if m.higher_is_better else 'lower'} | "
                    f"{', '.join(owners)} | {_cell(m.definition)} |")
    return "\n".join(rows)


def samples_table() -> str:
    from clipcache.flows.config.task_params import builtin_tasks

    rows = ["| task | unit | columns | a row |", "|---|---|---|---|"]
    for task in builtin_tasks():
        for spec in task.samples:
            columns = ", ".join(f"`{c}`" for c in spec.columns) or "none"
            rows.append(f"| {task.name} | `{spec.unit}` | {columns} | {_cell(spec.meaning)} |")
    return "\n".join(rows)


def recomputed_table() -> str:
    from clipcache.flows.config.task_params import builtin_tasks

    rows = ["| task | unit | recomputes |", "|---|---|---|"]
    for task in builtin_tasks():
        rows += [f"| {task.name} | `{spec.unit}` | {_cell(spec.recomputes)} |" for spec in task.samples if spec.recomputes]
    return "\n".join(rows)


TABLES = {"task options": ("cli.md", options_table), "metrics": ("metrics.md", metrics_table),
          "sample rows": ("results.md", samples_table), "recomputed metrics": ("results.md", recomputed_table)}


def block(what: str, table: str) -> str:
    return f"{BEGIN.format(what=what)}\n{table}\n{END}"


def stored(what: str) -> str | None:
    """The generated block of ``what`` as the docs page holds it (None: the page has none)."""
    page, _ = TABLES[what]
    text = (DOCS / page).read_text(encoding="utf-8")
    found = re.search(re.escape(BEGIN.format(what=what)) + r".*?" + re.escape(END), text, re.DOTALL)
    return found.group(0) if found else None


def main() -> int:
    for what, (page, make) in TABLES.items():
        path = DOCS / page
        text = path.read_text(encoding="utf-8")
        old = stored(what)
        if old is None:
            print(f"{path}: no generated {what} table (add the marker lines {BEGIN.format(what=what)!r} and "
                  f"{END!r})", file=sys.stderr)
            return 1
        path.write_text(text.replace(old, block(what, make())), encoding="utf-8")
        print(f"wrote the {what} table in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
