"""``clipcache datasets`` and ``clipcache models``: what can be evaluated."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from clipcache.flows.cli.commands import add_command

if TYPE_CHECKING:
    from clipcache.tasks.datasets.record import DatasetRecord


def add_datasets_parser(sub: argparse._SubParsersAction) -> None:
    d = add_command(sub, "datasets")
    d.add_argument("--cache_dir", "--cache-dir", dest="cache_dir", default="cache")
    d.add_argument("--hub", choices=["huggingface", "modelscope"], default="huggingface")
    d.add_argument("--markdown", action="store_true", help="print the README's catalog table")
    d.add_argument("--format", choices=["table", "json"], default="table",
                   help="json: every record with all its fields (licence, citation and reference read from mteb)")
    d.add_argument("--details", default=None, metavar="NAME",
                   help="everything known about one dataset name (mieb:<task> included): sources, layouts, splits, "
                        "languages, licence, reference, citation and where they were read")
    d.set_defaults(handler=run_datasets)


def add_models_parser(sub: argparse._SubParsersAction) -> None:
    m = add_command(sub, "models")
    m.add_argument("--filter", default=None, help="only names containing this text")
    m.add_argument("--types", action="store_true", help="list the model loaders (--model_type values) instead")
    m.add_argument("--api-formats", "--api_formats", dest="api_formats", action="store_true",
                   help="list the request formats of api: models (--api_format values) instead")
    m.set_defaults(handler=run_models)


# The sources of clip_benchmark's builder names: their rows are the README's table (`clipcache datasets --markdown`)
CLIP_BENCHMARK_SOURCES = {"original", "webdataset", "hosted"}


def _clip_benchmark(record: DatasetRecord) -> bool:
    """A name of clip_benchmark's builder or hosted catalog (or one it has that clipcache does not read)."""
    return not record.readable or (not record.is_pattern and set(record.sources) <= CLIP_BENCHMARK_SOURCES)


def listed_records() -> list[DatasetRecord]:
    """The catalog in listing order: the registered readers' names, clip_benchmark's names (sorted), then the
    other families and the folder formats any name may have, in the order the lookup asks their sources."""
    from clipcache.tasks.datasets import dataset_catalog

    records = dataset_catalog()
    registered = [r for r in records if r.sources[:1] == ("registered",)]
    clip_benchmark = sorted((r for r in records if _clip_benchmark(r)), key=lambda r: r.name)
    rest = [r for r in records if r not in registered and r not in clip_benchmark]
    return [*registered, *clip_benchmark, *(r for r in rest if not r.is_pattern), *(r for r in rest if r.is_pattern)]


def _layout(record: DatasetRecord) -> str:
    """What the listing shows under "original layout": the first layout, and which package adds a plugin's name."""
    layout = record.layouts[0] if record.layouts else ""
    return layout if record.origin == "clipcache" else f"{layout}; {record.origin}"


def catalog_rows(cache_dir: str, hub: str) -> list[dict]:
    """One row per record of the dataset catalog (every name the lookup resolves, and clip_benchmark's names it
    does not read), with what is downloaded of the hosted ones."""
    from clipcache.flows.cli.cache import human_bytes
    from clipcache.storage.embedding_store import folder_bytes
    from clipcache.tasks.datasets.clip_benchmark.download import HubDataset

    rows = []
    for record in listed_records():
        row = {"name": record.name, "task": record.task, "original layout": _layout(record), "hosted": record.hosted,
               "cached": "", "size": ""}
        if record.hosted and not record.is_pattern and "hosted" in record.sources:
            hosted = HubDataset(hub, record.hosted)
            root = hosted.local_root(cache_dir)
            splits = sorted(p.parent.name for p in root.glob("*/.complete.json"))
            row.update(hosted=hosted.repo, cached=", ".join(splits) or "no",
                       size=human_bytes(folder_bytes(root)) if root.exists() else "")
        rows.append(row)
    return rows


def markdown_table() -> str:
    """The README's table: clip_benchmark's names with their original layout and hub repository."""
    lines = ["| name | task | original layout under `--dataset_root` | Hugging Face / ModelScope webdataset |",
             "|---|---|---|---|"]
    for record in listed_records():
        if not _clip_benchmark(record):
            continue
        note = f" ({record.note})" if record.note else ""
        original = record.layouts[0] if record.layouts else ""
        if "original" in record.sources:
            what, _, folder = original.partition(": ")
            original = f"{what}: `{folder}`"
        hosted = f"`{record.hosted}`" if record.hosted else ""
        lines.append(f"| `{record.name}`{note} | {record.task} | {original.replace('|', '/')} | {hosted} |")
    return "\n".join(lines)


COLUMNS = ("name", "task", "original layout", "hosted", "cached", "size")


def run_datasets(args: argparse.Namespace) -> int:
    from rich.table import Table  # on use: building the CLI does not import rich

    from clipcache.flows.cli.console import data_console

    if args.markdown:
        print(markdown_table())
        return 0
    if args.details is not None:
        return _details(args.details)
    if args.format == "json":
        return _json()
    table = Table(title=f"datasets ({args.hub}; cache {args.cache_dir})")
    for column in COLUMNS:
        table.add_column(column, justify="right" if column == "size" else "left")
    for row in catalog_rows(args.cache_dir, args.hub):
        table.add_row(*(row[c] for c in COLUMNS))
    data_console(200).print(table)
    return 0


def record_dict(record: DatasetRecord) -> dict:
    """A record as JSON: every field, tuples as lists, the pattern flag."""
    import dataclasses

    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(record).items()}
    return {**fields, "pattern": record.is_pattern}


def _json() -> int:
    import json

    from clipcache.tasks.datasets.citations import cited

    print(json.dumps([record_dict(cited(r)) for r in listed_records()], indent=1, ensure_ascii=False))
    return 0


DETAIL_FIELDS = ("name", "task", "sources", "layouts", "hosted", "languages", "splits", "main_metric", "note",
                 "origin", "licence", "reference", "facts_from", "citation")


def _details(name: str) -> int:
    """One record, a field a line, wrapped to 80 columns (the citation as BibTeX, as its source writes it)."""
    import textwrap

    from clipcache.tasks.datasets import record_of
    from clipcache.tasks.datasets.citations import cited

    row = record_dict(cited(record_of(name)))
    for field in DETAIL_FIELDS:
        value = row[field]
        if isinstance(value, list):
            value = ", ".join(value)
        label = field.replace("_", " ")
        if value is None:
            value = "any the files hold" if field == "splits" else ""
        if field == "citation":
            print(f"{label}:" + "".join(f"\n  {line}" for line in str(value).splitlines()) if value else f"{label}: -")
            continue
        print(textwrap.fill(str(value) or "-", 80, initial_indent=f"{label + ':':<13}", subsequent_indent=" " * 13,
                            break_long_words=False, break_on_hyphens=False))
    return 0


def run_models(args: argparse.Namespace) -> int:
    import open_clip
    from rich.table import Table  # on use: building the CLI does not import rich

    from clipcache.flows.cli.console import data_console
    from clipcache.tasks.models.open_clip_loader import BUNDLED
    from clipcache.tasks.models.presets import presets as load_presets
    from clipcache.tasks.models.st_loader import BUNDLED_TEXT

    if args.types:
        return _model_types()
    if getattr(args, "api_formats", False):
        from clipcache.tasks.models.api_formats import format_rows

        table = Table(title="request formats of api: models (--api_format)")
        for column in ("name", "request", "query / document roles", "from"):
            table.add_column(column)
        for row in format_rows():
            table.add_row(*row)
        data_console(160).print(table)
        return 0
    presets = load_presets()
    rows = [("bundled", name, "", "open_clip local-dir") for name in BUNDLED]
    rows += [("bundled", name, "", "sentence_transformers (text)") for name in BUNDLED_TEXT]
    rows += [("open_clip", arch, tag, "--model ARCH --pretrained TAG") for arch, tag in open_clip.list_pretrained()]
    for hub in ("huggingface", "modelscope"):
        rows += [(hub, p["id"], "", p["type"]) for p in presets[hub]]
    if args.filter:
        rows = [r for r in rows if args.filter.lower() in " ".join(r).lower()]
    table = Table(title=f"{len(rows)} models")
    for column in ("source", "model", "pretrained", "how"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    data_console(140).print(table)
    return 0


def _model_types() -> int:
    from rich.table import Table
    from rich.text import Text

    from clipcache.flows.cli.console import data_console, styled
    from clipcache.storage.errors import ModelError
    from clipcache.tasks.models import LOADERS
    from clipcache.tasks.models.resolve import get_loader

    table = Table(title="model loaders (--model_type)")
    for column in ("name", "what it loads", "from"):
        table.add_column(column)
    for name in LOADERS.names():
        description: str | Text
        try:
            description = get_loader(name).description
        except ModelError as e:  # a broken plugin is listed with its problem, not hidden
            description = styled("cannot be used:", "red", str(e))
        table.add_row(name, description, LOADERS.origin(name))
    data_console(160).print(table)
    return 0
