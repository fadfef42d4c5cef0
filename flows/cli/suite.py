"""``clipcache suite list | show | score | export | check``: suites of datasets, their honest averages, exports
(open_clip's CSVs, DataComp's JSONL, mteb's results folder) and the check of a published table.

Running a suite is ``clipcache eval --suite <suite> --model ...`` (what is cached is not recomputed)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

    from clipcache.tasks.suites import Suite
    from clipcache.tasks.suites.scoring import ModelScore

from clipcache.flows.cli.commands import add_command

MODEL_HELP = ("only these models, each named as `clipcache compare` takes one (as eval was given it: a name, "
              "local-dir:PATH, a --pretrained file alone or as model@file, model@checkpoint, an experiment id "
              "prefix; or model/pretrained)")


def add_suite_parser(sub: argparse._SubParsersAction) -> None:
    s = add_command(sub, "suite",
                    description="A suite lists datasets with their main metric and chance score. `suite score` "
                                "averages the main metrics over the whole suite from the warehouse (a partial "
                                "score is labelled so and lists what is missing), with 95% bootstrap intervals "
                                "from the per-sample rows and the models whose order is not separable at 5%. "
                                "Run a suite with `clipcache eval --suite NAME --model ...`.")
    actions = s.add_subparsers(dest="suite_command", required=True)
    actions.add_parser("list", help="the shipped suites").set_defaults(handler=run_list)
    show = actions.add_parser("show", help="a suite's datasets, main metrics and chance scores")
    show.add_argument("suite", help="a shipped suite's name or a suite .yaml file")
    show.set_defaults(handler=run_show)
    score = actions.add_parser("score", help="the suite's score per model, from the warehouse")
    score.add_argument("suite", help="a shipped suite's name or a suite .yaml file")
    score.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    score.add_argument("--model", nargs="+", default=None, help=MODEL_HELP)
    score.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (0: no intervals)")
    score.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    score.add_argument("--format", choices=["table", "json"], default="table")
    score.set_defaults(handler=run_score)
    export = actions.add_parser("export", help="the suite's results as open_clip's CSVs, DataComp's JSONL or mteb's "
                                               "results folder")
    export.add_argument("suite", help="a shipped suite's name or a suite .yaml file")
    export.add_argument("--format", required=True, choices=["openclip", "openclip_retrieval", "datacomp", "mteb"],
                        help="openclip: openclip_results.csv columns; openclip_retrieval: "
                             "openclip_retrieval_results.csv columns; datacomp: DataComp's eval_results.jsonl "
                             "(one --model); mteb: mteb's results folder (<out>/results/<model>/<revision>/"
                             "<TaskName>.json) for the datasets with a MIEB counterpart")
    export.add_argument("--out", required=True, help="file to write (--format mteb: an mteb cache folder); never "
                                                     "inside the warehouse or an embedding cache")
    export.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    export.add_argument("--cache_dir", "--cache-dir", dest="cache_dir", default="cache",
                        help="the embedding cache, which --out may not write into (default: cache; any folder with "
                             "a cache's layout is refused too)")
    export.add_argument("--model", nargs="+", default=None, help=MODEL_HELP)
    export.set_defaults(handler=run_export)
    check = actions.add_parser("check", help="a published table (open_clip's CSV, your paper's numbers) against "
                                             "our values and intervals")
    check.add_argument("suite", help="a shipped suite's name or a suite .yaml file")
    check.add_argument("--published", required=True, help="CSV with name, pretrained and one column per dataset "
                                                          "(display name or dataset name), or a shipped table: "
                                                          "internvl (InternVL's README numbers)")
    check.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    check.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of our intervals")
    check.add_argument("--model", nargs="+", default=None, help=MODEL_HELP)
    check.add_argument("--format", choices=["table", "json"], default="table")
    check.set_defaults(handler=run_check)


def run_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from clipcache.flows.cli.console import data_console
    from clipcache.tasks.suites import load_suite, shipped

    table = Table(title="suites")
    for column in ("suite", "datasets", "runnable here", "description"):
        table.add_column(column)
    for name in shipped():
        suite = load_suite(name)
        table.add_row(name, str(len(suite.datasets)), str(len(suite.runnable())), suite.description)
    data_console(160).print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    from rich.table import Table

    from clipcache.flows.cli.console import data_console
    from clipcache.tasks.suites import load_suite

    suite = load_suite(args.suite)
    table = Table(title=f"{suite.name}: {suite.description}")
    for column in ("dataset", "name", "task", "main metric", "chance", "size", "tags", "note"):
        table.add_column(column)
    for e in suite.datasets:
        table.add_row(e.dataset, e.name or "", e.task, e.main_metric, "" if e.chance is None else f"{e.chance:.4f}",
                      "" if e.size is None else str(e.size), ", ".join(e.tags),
                      ("not runnable here; " if not e.runnable else "") + (e.note or ""))
    console = data_console(200)
    console.print(table)
    if suite.source:
        console.print(f"source: {suite.source}")
    return 0


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _interval(bounds: tuple[float | None, float | None]) -> str:
    return "" if bounds[0] is None or bounds[1] is None else f"[{bounds[0]:.4f}, {bounds[1]:.4f}]"


def score_payload(suite: Any, scores: list[Any]) -> list[dict[str, Any]]:
    return [{"suite": suite.name, "model": s.model[0], "pretrained": s.model[1], "checkpoint": s.model[2],
             "precision": s.model[3], "complete": s.complete, "score": s.score,
             "score_ci": list(s.score_ci), "normalized": s.normalized, "normalized_ci": list(s.normalized_ci),
             "partial_score": None if s.complete else s.partial_score,
             "datasets_present": len(s.present), "datasets": len(s.results),
             "missing": [e.dataset for e in s.missing], "rank": s.rank, "not_separable_from": s.not_separable_from,
             "groups": s.groups,
             "per_dataset": [{"dataset": r.entry.dataset, "main_metric": r.entry.main_metric, "value": r.value,
                              "chance": r.entry.chance, "normalized": r.normalized,
                              "experiment_id": r.experiment_id} for r in s.results]}
            for s in scores]


def run_score(args: argparse.Namespace) -> int:
    from clipcache.flows.cli.query import check_output_dir
    from clipcache.storage.errors import ConfigError
    from clipcache.storage.warehouse import read_results
    from clipcache.tasks.suites import load_suite
    from clipcache.tasks.suites.scoring import score_suite

    if args.bootstrap < 0:
        raise ConfigError("--bootstrap: give 0 (no intervals) or more resamples")
    suite = load_suite(args.suite)
    check_output_dir(args.output_dir)
    scores = read_results(args.output_dir, lambda con: score_suite(con, suite, resamples=args.bootstrap,
                                                                   seed=args.seed, models=args.model))
    if args.format == "json":
        json.dump(score_payload(suite, scores), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table

    from clipcache.flows.cli.console import data_console

    console = data_console(200)
    if not scores:
        console.print(f"no results for any dataset of suite {suite.name} under {args.output_dir}: run "
                      f"`clipcache eval --suite {args.suite} --model ...` first")
        return 0
    table = Table(title=f"suite {suite.name} ({len(suite.datasets)} datasets)")
    for column in ("rank", "model", "score", "95% interval", "normalized", "95% interval ", "datasets",
                   "not separable from (5%)"):
        table.add_column(column, justify="left" if column.startswith(("model", "not")) else "right")
    for s in sorted(scores, key=lambda s: (s.rank is None, s.rank or 0, -(s.partial_score or 0))):
        if s.complete:
            score = _fmt(s.score)
        else:
            score = f"partial {_fmt(s.partial_score)}"
        table.add_row("" if s.rank is None else str(s.rank), s.label, score, _interval(s.score_ci),
                      _fmt(s.normalized), _interval(s.normalized_ci), f"{len(s.present)}/{len(s.results)}",
                      ", ".join(s.not_separable_from))
    console.print(table)
    for s in scores:
        if not s.complete:
            names = [e.dataset for e in s.missing]
            shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
            console.print(f"{s.label}: partial: {len(names)} of {len(s.results)} datasets have no current result "
                          f"({shown}); the partial score is the mean over the other {len(s.present)} and is not "
                          f"comparable with a full suite score")
        elif s.score_ci[0] is None:
            why = sorted({f"{r.entry.dataset}: {r.why_no_draws}" for r in s.results if r.why_no_draws})
            if why and args.bootstrap:
                console.print(f"{s.label}: no interval ({'; '.join(why[:3])})")
        if s.groups and any(v is not None for v in s.groups.values()):
            console.print(f"{s.label}: " + ", ".join(f"{g} {_fmt(v) or 'n/a'}" for g, v in s.groups.items()))
    return 0


def _scores(args: argparse.Namespace, resamples: int, then: Any = None) -> tuple[Any, list[Any], Any]:
    """(suite, scores, then(con, suite, scores)): all of it read from one consistent view of the warehouse
    (started over if `results compact` replaced the files meanwhile; storage/warehouse.py)."""
    from clipcache.flows.cli.query import check_output_dir
    from clipcache.storage.warehouse import read_results
    from clipcache.tasks.suites import load_suite
    from clipcache.tasks.suites.scoring import score_suite

    suite = load_suite(args.suite)
    check_output_dir(args.output_dir)

    def read(con: DuckDBPyConnection) -> tuple[list[ModelScore], Any]:
        scores = score_suite(con, suite, resamples=resamples, models=getattr(args, "model", None))
        return scores, (then(con, suite, scores) if then is not None and scores else None)

    scores, extra = read_results(args.output_dir, read)
    return suite, scores, extra


def run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clipcache.storage.atomic import atomic_write_text
    from clipcache.storage.errors import ConfigError
    from clipcache.storage.warehouse import check_export_path
    from clipcache.tasks.suites import exports

    mteb = args.format == "mteb"
    out = check_export_path(args.out, args.output_dir, cache_dir=args.cache_dir, folder=mteb)
    if not Path(out).parent.is_dir():
        raise ConfigError(f"--out: folder {Path(out).parent} does not exist")
    def export(con: DuckDBPyConnection, suite: Suite, scores: list[ModelScore]) -> Any:
        if mteb:
            from clipcache.tasks.suites.mteb_export import write_mteb_results

            return write_mteb_results(con, suite, scores, Path(out), check=lambda folder: check_export_path(
                folder, args.output_dir, cache_dir=args.cache_dir, folder=True))
        if args.format == "openclip":
            return exports.openclip_csv(suite, scores)
        if args.format == "openclip_retrieval":
            return exports.openclip_retrieval_csv(con, suite, scores)
        if len(scores) != 1:
            raise ConfigError(f"--format datacomp: DataComp's file holds one model; {len(scores)} have results "
                              f"({', '.join(s.label for s in scores)}): choose one with --model")
        return exports.datacomp_jsonl(con, scores[0])

    suite, scores, written = _scores(args, resamples=0, then=export)
    if not scores:
        raise ConfigError(f"no results for any dataset of suite {suite.name} under {args.output_dir}")
    if mteb:
        files = written
        if not files:
            raise ConfigError(f"--format mteb: no result of suite {suite.name} is a MIEB task (datasets with a "
                              f"MIEB counterpart: tasks/suites/mieb_tasks.json, or named mieb:<TaskName>)")
        models = len({f.parent for f in files})
        print(f"wrote {len(files)} mteb task result(s) of {models} model(s) under {Path(out) / 'results'}")
        return 0
    atomic_write_text(Path(out), written)
    print(f"wrote {out} ({len(scores)} model(s), suite {suite.name})")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clipcache.storage.errors import ConfigError
    from clipcache.tasks.suites.exports import check_published

    if args.bootstrap < 0:
        raise ConfigError("--bootstrap: give 0 (no intervals) or more resamples")
    suite, scores, _ = _scores(args, resamples=args.bootstrap)
    rows = check_published(suite, scores, Path(args.published))
    if args.format == "json":
        json.dump([{**r.__dict__, "difference": r.difference, "verdict": r.verdict} for r in rows], sys.stdout,
                  indent=1)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table

    from clipcache.flows.cli.console import data_console

    console = data_console(200)
    if not rows:
        console.print(f"no row of {args.published} is a model with results here (matched on name and pretrained)")
        return 0
    table = Table(title=f"{args.published} vs our results (suite {suite.name})")
    for column in ("model", "dataset", "ours", "published", "difference", "our 95% interval", "verdict"):
        table.add_column(column, justify="left" if column in ("model", "dataset", "verdict") else "right")
    for r in rows:
        table.add_row(r.model + (f" @ {r.pretrained}" if r.pretrained else ""), r.dataset, _fmt(r.ours),
                      _fmt(r.published), "" if r.difference is None else f"{r.difference:+.4f}",
                      _interval((r.ci_low, r.ci_high)), r.verdict)
    console.print(table)
    outside = sum(r.verdict == "outside our interval" for r in rows)
    console.print(f"{outside} of {len(rows)} published values lie outside our 95% interval")
    return 0
