"""``clipcache cache ls | info KEY | verify [KEY ...] | rm KEY ... | gc``: look after the embedding cache and the
caption setups beside it (storage/caption_admin.py: captions a CoCa generated or a VLM wrote through ``convert``)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from clipcache.flows.cli.commands import add_command

if TYPE_CHECKING:
    from rich.console import Console


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def add_cache_parser(sub: argparse._SubParsersAction) -> None:
    cache = add_command(sub, "cache")
    cache.add_argument("--cache_dir", "--cache-dir", dest="cache_dir", default="cache")
    actions = cache.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("ls", help="list entries (model, dataset, split, kind, rows, dim, size, dates)")
    ls.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    ls.add_argument("--task", help="only the entries this task reads (e.g. linear_probe)")
    info = actions.add_parser("info", help="everything stored about one entry (a unique key prefix is enough)")
    info.add_argument("key")
    verify = actions.add_parser("verify", help="check stored keys and chunk checksums; exit 1 if anything is damaged")
    verify.add_argument("keys", nargs="*", help="key prefixes (default: every entry)")
    verify.add_argument("--delete", action="store_true", help="delete damaged entries so the next eval re-encodes them")
    rm = actions.add_parser("rm", help="delete entries by key prefix (the next eval that needs them re-encodes them)")
    rm.add_argument("keys", nargs="+", help="key prefixes (each must name one entry)")
    gc = actions.add_parser("gc", help="delete entries by age, pattern or total size (least recently used first)")
    gc.add_argument("--older_than", "--older-than", dest="older_than", help="unused for longer than e.g. 30d, 12h")
    gc.add_argument("--max_size", "--max-size", dest="max_size", help="shrink the cache to at most e.g. 20GB")
    gc.add_argument("--pattern", help="glob over key, model, dataset or kind, e.g. '*ViT-L*'")
    gc.add_argument("--partial", action="store_true", help="also delete interrupted (partial) entries")
    gc.add_argument("--dry_run", "--dry-run", dest="dry_run", action="store_true")
    for action in (ls, info, verify, rm, gc):  # `cache verify --cache_dir X` works as well as `cache --cache_dir X verify`
        action.add_argument("--cache_dir", "--cache-dir", dest="cache_dir", default=argparse.SUPPRESS)
    cache.set_defaults(handler=run_cache_command)


def run_cache_command(args: argparse.Namespace) -> int:
    from clipcache.storage.embedding_store import EmbeddingStore

    store = EmbeddingStore(args.cache_dir)
    if not store.root.exists():  # a mistyped folder must not pass as an empty, healthy cache
        from clipcache.storage.errors import ConfigError

        raise ConfigError(f"cache_dir: {args.cache_dir} does not exist (no cache there; `clipcache eval` creates one)")
    from clipcache.flows.cli.console import data_console

    out = data_console(160)
    return {"ls": _ls, "info": _info, "verify": _verify, "rm": _rm, "gc": _gc}[args.action](store, args, out)


def _ls(store, args, out: Console) -> int:
    from dataclasses import replace

    from clipcache.flows.cli.console import short_task
    from clipcache.storage.cache_admin import list_entries
    from clipcache.storage.caption_admin import list_setups
    from clipcache.tasks.evaluation import TASKS, tasks_served

    if args.task is not None:
        TASKS.get(args.task)  # an unknown name: one line with "did you mean"
    infos = [replace(i, tasks=tuple(tasks_served(i.role, i.dataset_format, i.arrays)) if i.complete else ())
             for i in list_entries(store)]
    setups = list_setups(store.root)
    if args.task is not None:
        infos = [i for i in infos if args.task in i.tasks]
        setups = [i for i in setups if args.task in i.tasks]
    if args.json:
        for info in infos + setups:
            print(json.dumps(info.as_dict()))  # JSON lines, for jq / scripts
        return 0
    from rich.table import Table

    table = Table(title=f"{store.root}: {len(infos)} entries, {human_bytes(sum(i.bytes for i in infos))}")
    for column in ("key", "kind", "model", "dataset", "split", "serves", "rows", "dim", "dtype", "size", "created",
                   "last used"):
        table.add_column(column, justify="right" if column in ("rows", "dim", "size") else "left")
    for i in infos:
        table.add_row(i.key[:12], i.kind, i.model, i.dataset, i.split, ", ".join(short_task(t) for t in i.tasks),
                      f"{i.count:,}", str(i.dim or ""), i.dtype, human_bytes(i.bytes), i.created, i.last_used)
    out.print(table)
    if setups:
        table = Table(title=f"{len(setups)} caption setup{'s' if len(setups) > 1 else ''}, "
                            f"{human_bytes(sum(i.bytes for i in setups))}")
        for column in ("key", "model", "settings", "images", "size", "created", "last written"):
            table.add_column(column, justify="right" if column in ("images", "size") else "left",
                             overflow="fold")
        for i in setups:
            table.add_row(i.key[:12], i.model, i.settings, f"{i.count:,}", human_bytes(i.bytes), i.created,
                          i.last_used)
        out.print(table)
    return 0


def _resolve(store, prefix: str) -> tuple[str, str]:
    """(``embeddings`` or ``captions``, the full key) of the one entry or caption setup whose key starts with
    ``prefix`` (as git resolves commit ids)."""
    from clipcache.storage.caption_admin import KIND, captions_dir, setup_keys
    from clipcache.storage.errors import CacheIntegrityError

    matches = [("embeddings", k) for k in sorted(set(store.keys() + store.partial_keys())) if k.startswith(prefix)]
    matches += [(KIND, k) for k in setup_keys(captions_dir(store.root)) if k.startswith(prefix)]
    if len(matches) != 1 or not prefix:
        found = "no entry or caption setup" if not matches else f"{len(matches)} entries and caption setups"
        raise CacheIntegrityError(f"{found} in {store.root} with a key starting with {prefix!r}")
    return matches[0]


def _info(store, args, out: Console) -> int:
    kind, key = _resolve(store, args.key)
    if kind != "embeddings":
        from clipcache.storage.caption_admin import captions_dir, describe_setup, read_setup

        info = describe_setup(store.root, key)
        out.print_json(json.dumps({"key": key, "kind": kind, "path": f"{captions_dir(store.root)}/{key}.jsonl",
                                   "setup": read_setup(store.root, key),
                                   "images": info.count, "bytes": info.bytes, "created": info.created,
                                   "last_written": info.last_used}))
        return 0
    entry = store.open(key)
    out.print_json(json.dumps({"key": key, "path": str(entry.path), "arrays": {
        name: {"shape": list(entry._group[name].shape), "dtype": str(entry._group[name].dtype)}
        for name in entry._group.array_keys()}, **{k: v for k, v in entry.attrs.items() if k not in ("chunk_seals", "chunk_sha256")},
        "chunks": len(entry.attrs.get("chunk_seals", entry.attrs.get("chunk_sha256", [])))}, default=str))
    return 0


def _verify(store, args, out: Console) -> int:
    from clipcache.storage.caption_admin import KIND, captions_dir, setup_keys, verify_setup

    keys = [_resolve(store, k) for k in args.keys] if args.keys else \
        [("embeddings", k) for k in store.keys()] + [(KIND, k) for k in setup_keys(captions_dir(store.root))]
    damaged = 0
    for kind, key in keys:
        problems = store.verify(key) if kind == "embeddings" else verify_setup(store.root, key)
        if not problems:
            continue
        damaged += 1
        for problem in problems:
            from clipcache.flows.cli.console import styled

            out.print(styled("damaged", "red", f"{key}: {problem}"), highlight=False, soft_wrap=True)
        if args.delete:
            _remove(store, kind, key, out)
    setups = sum(kind == KIND for kind, _ in keys)
    out.print(f"verified {len(keys) - setups} entries{f' and {setups} caption setups' if setups else ''}: "
              f"{damaged} damaged")
    return 1 if damaged else 0


def _remove(store, kind: str, key: str, out: Console) -> None:
    if kind == "embeddings":
        store.remove(key)
        out.print(f"deleted {key}; the next `clipcache eval` that needs it re-encodes it")
        return
    from clipcache.storage.caption_admin import remove_setup

    remove_setup(store.root, key)
    out.print(f"deleted caption setup {key}; the next run that needs its captions generates them again (a VLM's: "
              f"`clipcache convert` asks the API again)")


def _rm(store, args, out: Console) -> int:
    keys = [_resolve(store, k) for k in args.keys]  # all resolved before anything is deleted
    for kind, key in keys:
        _remove(store, kind, key, out)
    return 0


def _gc(store, args, out: Console) -> int:
    from clipcache.storage.cache_admin import list_entries, parse_age, parse_size, select_garbage

    if not (args.older_than or args.max_size or args.pattern or args.partial):
        from clipcache.storage.errors import ConfigError

        raise ConfigError("cache gc: give --older_than, --max_size, --pattern and/or --partial")
    from clipcache.storage.caption_admin import KIND, list_setups, remove_setup

    infos = list_entries(store, include_partial=False) + list_setups(store.root)
    chosen = select_garbage(infos, parse_age(args.older_than) if args.older_than else None,
                            parse_size(args.max_size) if args.max_size else None, args.pattern)
    partial: set[str] = set()
    if args.partial:
        from clipcache.storage.cache_admin import describe_partial

        partial = set(store.partial_keys())
        chosen += [describe_partial(store, k) for k in sorted(partial)]
    freed, deleted = 0, 0
    for info in chosen:
        if args.dry_run:
            out.print(f"would delete {info.key[:12]} {info.kind} {info.model} {info.dataset} "
                      f"({human_bytes(info.bytes)})", highlight=False)
            freed, deleted = freed + info.bytes, deleted + 1
            continue
        # never wait for, nor delete, what a running encode (or convert's captioner) holds: its lock says it is in use
        if info.kind == KIND:
            gone = remove_setup(store.root, info.key, wait=False)
        else:
            gone = store.remove(info.key, wait=False, partial_only=info.key in partial)
        if gone is None:
            out.print(f"kept {info.key[:12]} {info.kind} {info.model} {info.dataset}: in use by a running "
                      f"{'convert or generation' if info.kind == KIND else 'encode'}",
                      highlight=False)
            continue
        out.print(f"deleted {info.key[:12]} {info.kind} {info.model} {info.dataset} ({human_bytes(gone)})",
                  highlight=False)
        freed, deleted = freed + gone, deleted + 1
    out.print(f"{'would free' if args.dry_run else 'freed'} {human_bytes(freed)} in {deleted} entries")
    return 0
