"""``clipcache compare --baseline A --candidate B``: is B better than A, on what, and is the difference real?"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

from clipcache.flows.cli.commands import add_command


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    c = add_command(sub, "compare",
                    description="Line up every dataset and metric two experiments (or two models' reference "
                                "experiments) share, from their per-sample rows: the difference, its paired "
                                "bootstrap 95% interval, a p-value (exact McNemar for acc@1 / acc@5), the samples "
                                "flipped each way and a verdict at the 5% level. SQL: sample_flips('<id A>', "
                                "'<id B>') in `clipcache query`.")
    c.add_argument("--baseline", required=True, help="experiment id (or a unique prefix), model, model@checkpoint")
    c.add_argument("--candidate", required=True, help="experiment id (or a unique prefix), model, model@checkpoint")
    c.add_argument("--output_dir", "--output-dir", dest="output_dir", default="outputs")
    c.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    c.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    c.add_argument("--format", choices=["table", "json"], default="table")
    c.add_argument("--captions", type=int, default=None, metavar="N",
                   help="captioning: show N images with both captions and their references, the largest score "
                        "difference first (default 10 in a table, none in JSON; with --format json the output "
                        "becomes {\"comparisons\": [...], \"captions\": [...]})")
    c.set_defaults(handler=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from clipcache.flows.cli.query import check_output_dir
    from clipcache.storage.errors import ConfigError
    from clipcache.storage.warehouse import read_results
    from clipcache.tasks.report.caption_compare import CaptionPair, caption_pairs
    from clipcache.tasks.report.compare import ComparisonRow, compare

    if args.bootstrap < 1:
        raise ConfigError("--bootstrap: give at least 1 resample")
    if args.captions is not None and args.captions < 0:
        raise ConfigError(f"--captions: give a number of images (0 or more), not {args.captions}")
    check_output_dir(args.output_dir)
    shown = args.captions if args.captions is not None else (0 if args.format == "json" else 10)

    def read(con: DuckDBPyConnection) -> tuple[list[ComparisonRow], list[CaptionPair]]:
        rows = compare(con, args.baseline, args.candidate, resamples=args.bootstrap, seed=args.seed)
        return rows, (caption_pairs(con, args.baseline, args.candidate, limit=shown) if shown else [])

    rows, captions = read_results(args.output_dir, read)
    if args.format == "json":
        listed = [r.as_dict() for r in rows]
        json.dump(listed if args.captions is None else {"comparisons": listed,
                                                        "captions": [c.as_dict() for c in captions]},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table
    from rich.text import Text

    from clipcache.flows.cli.console import data_console

    console = data_console(160)  # dataset names and ids are data, never markup
    # every column needs about 150 columns; a narrower terminal gets the columns a verdict rests on, whole names
    narrow = console.width < 150
    columns: tuple[str, ...] = ("dataset", "metric", "n", "baseline", "candidate", "difference", "95% interval", "p",
                                "p (Holm)", "flips +/-", "verdict")
    if narrow:
        columns = ("metric", "difference", "95% interval", "p", "verdict")
    table = Table(title=f"{args.candidate} vs {args.baseline}")
    if narrow:
        table.box = None
    longest = max((len(r.metric) for r in rows), default=6)
    for column in columns:
        table.add_column(column, justify="left" if column in ("dataset", "metric", "verdict") else "right",
                         overflow="fold", no_wrap=column != "verdict", min_width=longest if column == "metric" else None)

    def fmt(value: float | None, digits: int = 4) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    dataset = None
    for r in rows:
        flips = "" if r.flipped_to_correct is None else f"+{r.flipped_to_correct} / -{r.flipped_to_wrong}"
        cells = {"dataset": r.dataset, "metric": r.metric, "n": str(r.n), "baseline": fmt(r.baseline),
                 "candidate": fmt(r.candidate), "difference": f"{r.difference:+.4f}",
                 "95% interval": f"[{fmt(r.ci_low)}, {fmt(r.ci_high)}]", "p": fmt(r.p_value, 3),
                 "p (Holm)": fmt(r.p_holm, 3), "flips +/-": flips, "verdict": r.verdict}
        if narrow and r.dataset != dataset:
            dataset = r.dataset
            table.add_row(Text.assemble((r.dataset, "bold"), f" (n {r.n})"))
        table.add_row(*(cells[c] for c in columns))
    console.print(table)
    if narrow:
        console.print("(a wider terminal, or --format json, shows every column: n, both values, Holm's p, flips)")
    if len(rows) > 1:
        console.print(f"{len(rows)} comparisons: the verdicts use each p-value alone; 'p (Holm)' adjusts them for "
                      f"making {len(rows)} comparisons at once (read a verdict as real only if it is below 0.05)")
    if captions:
        print_captions(console, captions)
    return 0


def print_captions(console: Any, captions: list[Any]) -> None:
    """Each image's two captions and references, per dataset (captions are data: never markup)."""
    from rich.table import Table

    for dataset in dict.fromkeys(c.dataset for c in captions):
        chosen = [c for c in captions if c.dataset == dataset]
        table = Table(title=f"{dataset}: {len(chosen)} images, the largest {chosen[0].metric} difference first",
                      show_lines=True)
        for column in ("image", "baseline caption", "candidate caption", chosen[0].metric, "references"):
            table.add_column(column, justify="right" if column == chosen[0].metric else "left", overflow="fold")
        for c in chosen:
            table.add_row(c.sample_key or str(c.sample_index), c.baseline_caption, c.candidate_caption,
                          f"{c.baseline_value:.3f} -> {c.candidate_value:.3f}", "\n".join(c.reference_captions))
        console.print(table)
