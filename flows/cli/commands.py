"""Every ``clipcache`` command, in the order ``clipcache --help`` lists them: its one-line help and the function that
builds its parser. A command line builds the parser of the command it runs and only names the others (their help
line, what ``--help`` and a mistyped command's suggestion need), so ``clipcache eval`` imports and builds nothing
for ``cache``, ``compare`` or ``suite``. This module imports nothing: the table is read before any command module.
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple


class Command(NamedTuple):
    help: str
    builder: str  # "module:function" in clipcache.flows.cli that adds the command's parser to the subparsers


COMMANDS: dict[str, Command] = {
    "eval": Command("evaluate models on datasets (zero-shot classification / retrieval, ...)", "app:add_eval_parser"),
    "rescore": Command("recompute metrics from cached embeddings only (same flags as eval)", "app:add_eval_parser"),
    "run": Command("run an evalscope-style task config (JSON or YAML)", "app:add_run_parser"),
    "serve": Command("serve prefect.yaml's deployments (with their schedules) from this process",
                     "app:add_serve_parser"),
    "cache": Command("list, inspect, verify and clean the embedding cache (and its caption setups)",
                     "cache:add_cache_parser"),
    "query": Command("run SQL over the results (views: leaderboard, metrics, metrics_all, runs)",
                     "query:add_query_parser"),
    "compare": Command("compare two experiments or models sample by sample (intervals, McNemar)",
                       "compare:add_compare_parser"),
    "suite": Command("suites of datasets (DataComp, VTAB, clip_benchmark collections) and their scores",
                     "suite:add_suite_parser"),
    "results": Command("maintain the Parquet results (compact, migrate, verify)", "query:add_results_parser"),
    "report": Command("build the dbt marts and write a static HTML report (or, with --compare, pages of the samples "
                      "two experiments disagree on)", "query:add_report_parser"),
    "datasets": Command("every dataset name: task, original layout, hub repository, cached or not, size",
                        "catalog:add_datasets_parser"),
    "models": Command("known models: open_clip pretrained pairs, bundled, HF / ModelScope presets",
                      "catalog:add_models_parser"),
    "server": Command("start / stop a local Prefect server that later calls report to (UI)",
                      "server:add_server_parser"),
    "init": Command("write prefect.yaml and suites/nightly.yaml into a folder (deployments from the installed "
                    "package)", "init:add_init_parser"),
}


def add_command(sub: argparse._SubParsersAction, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of command ``name``, with its help line from ``COMMANDS``."""
    return sub.add_parser(name, help=COMMANDS[name].help, **kwargs)


def add_commands(sub: argparse._SubParsersAction, command: str | None, argv: Any = None) -> None:
    """Every command into ``sub``, in ``COMMANDS``' order: the one named ``command`` in full (``argv``: the
    arguments it will parse, for eval / rescore), the others by name and help line only. ``command`` None or not a
    command: every one by name only."""
    import importlib

    for name, (_, builder) in COMMANDS.items():
        if name != command:
            add_command(sub, name)
            continue
        module, _, function = builder.partition(":")
        build = getattr(importlib.import_module(f"clipcache.flows.cli.{module}"), function)
        if module == "app":
            build(sub, name, argv)
        else:
            build(sub)
