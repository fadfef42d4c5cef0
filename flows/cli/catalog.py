"""``clipcache datasets`` and ``clipcache models``: what can be evaluated."""

from __future__ import annotations

import argparse


def add_catalog_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("datasets", help="every dataset name: task, original layout, hub repository, cached or not, size")
    d.add_argument("--cache_dir", "--cache-dir", dest="cache_dir", default="cache")
    d.add_argument("--hub", choices=["huggingface", "modelscope"], default="huggingface")
    d.add_argument("--markdown", action="store_true", help="print the README's catalog table")
    d.set_defaults(handler=run_datasets)
    m = sub.add_parser("models", help="known models: open_clip pretrained pairs, bundled, HF / ModelScope presets")
    m.add_argument("--filter", default=None, help="only names containing this text")
    m.add_argument("--types", action="store_true", help="list the model loaders (--model_type values) instead")
    m.add_argument("--api-formats", "--api_formats", dest="api_formats", action="store_true",
                   help="list the request formats of api: models (--api_format values) instead")
    m.set_defaults(handler=run_models)


OWN_LAYOUTS = {"sugar_crepe": "SugarCrepe: val2017/ + <task>.json (clip_benchmark's layout)",
               "winoground": "the datasets cache of facebook/winoground, or its Parquet files",
               "custom": "evalscope's image_queries.jsonl", "imagefolder": "your <class>/<image> folders",
               "image_labels": "your image_labels.csv or .jsonl + classnames.txt"}


def catalog_rows(cache_dir: str, hub: str) -> list[dict]:
    """One row per name: clipcache's own datasets, then every name of clip_benchmark's builder and the hosted
    catalog, each with the layouts it is read from."""
    from clipcache.flows.cli.cache import human_bytes
    from clipcache.storage.embedding_store import folder_bytes
    from clipcache.tasks.datasets import DATASETS, catalog, registered_task
    from clipcache.tasks.datasets.download import HubDataset, repo_name
    from clipcache.tasks.datasets.layouts import describe, layouts, not_read, task_of

    rows = []
    for name in DATASETS.names():
        source = "bundled" if name.startswith("shapes") else OWN_LAYOUTS.get(name.split("/")[0],
                                                                              "your files (--dataset_root)")
        if DATASETS.origin(name) != "clipcache":  # a plugin: say which package adds it
            source = f"{source}; {DATASETS.origin(name)}"
        rows.append({"name": name, "task": registered_task(name), "original layout": source, "hosted": "",
                     "cached": "", "size": ""})
    for name in sorted(set(catalog()) | set(layouts()) | set(not_read())):
        row = {"name": name, "task": "", "original layout": "", "hosted": "", "cached": "", "size": ""}
        if name in layouts():
            row["task"], row["original layout"] = task_of(name), describe(name)
        elif name in not_read():
            row["original layout"] = not_read()[name]
        if name in catalog():
            hosted = HubDataset(hub, f"clip-benchmark/{repo_name(name)}")
            root = hosted.local_root(cache_dir)
            splits = sorted(p.parent.name for p in root.glob("*/.complete.json"))
            row.update(task=catalog()[name]["task"], hosted=hosted.repo, cached=", ".join(splits) or "no",
                       size=human_bytes(folder_bytes(root)) if root.exists() else "")
        rows.append(row)
    return rows


def markdown_table() -> str:
    from clipcache.tasks.datasets import catalog
    from clipcache.tasks.datasets.download import repo_name
    from clipcache.tasks.datasets.layouts import describe, layouts, not_read, task_of

    lines = ["| name | task | original layout under `--dataset_root` | Hugging Face / ModelScope webdataset |",
             "|---|---|---|---|"]
    for name in sorted(set(catalog()) | set(layouts()) | set(not_read())):
        row = catalog().get(name, {})
        note = f" ({row['notes']})" if row.get("notes") else ""
        task = row.get("task") or (task_of(name) if name in layouts() else "")
        if name in layouts():
            what, _, folder = describe(name).partition(": ")
            original = f"{what}: `{folder}`"
        else:
            original = not_read().get(name, "")
        hosted = f"`clip-benchmark/{repo_name(name)}`" if row else ""
        lines.append(f"| `{name}`{note} | {task} | {original.replace('|', '/')} | {hosted} |")
    return "\n".join(lines)


COLUMNS = ("name", "task", "original layout", "hosted", "cached", "size")


def run_datasets(args: argparse.Namespace) -> int:
    from rich.table import Table  # on use: building the CLI does not import rich

    from clipcache.flows.cli.console import data_console

    if args.markdown:
        print(markdown_table())
        return 0
    table = Table(title=f"datasets ({args.hub}; cache {args.cache_dir})")
    for column in COLUMNS:
        table.add_column(column, justify="right" if column == "size" else "left")
    for row in catalog_rows(args.cache_dir, args.hub):
        table.add_row(*(row[c] for c in COLUMNS))
    data_console(200).print(table)
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
