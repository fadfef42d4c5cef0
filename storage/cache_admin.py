"""Looking after the embedding cache: describe entries, find damaged ones, collect garbage by age/size/pattern.
(Caption setups, the cache's other kind of entry: storage/caption_admin.py.)"""

from __future__ import annotations

import fnmatch
import json
import re
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clipcache.storage.embedding_store import EmbeddingStore, folder_bytes
from clipcache.storage.errors import ConfigError
from clipcache.storage.paths import as_path

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*$", re.I)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.I)


@dataclass
class EntryInfo:
    key: str
    kind: str
    model: str
    dataset: str
    split: str
    count: int
    dim: int
    dtype: str
    bytes: int
    created: str
    last_used: str
    complete: bool = True
    role: str = "-"  # image, caption, prompt, corpus, query, corpus_image ... (its key fields' role)
    dataset_format: str = ""  # the dataset identity's format (wds, selection:..., any2any, beir...)
    arrays: tuple[str, ...] = ()  # arrays beside the embeddings (target, position, caption_row...)
    tasks: tuple[str, ...] = ()  # filled by the caller that knows the tasks (flows/cli/cache.py)
    settings: str = ""  # caption setups (storage/caption_admin.py): decoding settings, or a VLM's prompt

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(store: EmbeddingStore, key: str) -> EntryInfo:
    path = store.entry_path(key)
    attrs = json.loads((path / "zarr.json").read_text()).get("attributes", {})
    meta = attrs.get("meta", {})
    fields = attrs.get("key_fields", {})
    dataset = fields.get("dataset")
    last = store.last_used(key)
    return EntryInfo(key=key, kind=attrs.get("kind", "?"), model=meta.get("model", "?"),
                     dataset=meta.get("dataset", "-"), split=meta.get("split", "-"), count=int(attrs.get("count", 0)),
                     dim=int(attrs.get("dim", 0)), dtype=attrs.get("dtype", "?"), bytes=folder_bytes(path),
                     created=attrs.get("created_at", "?"), last_used=_iso(last), role=str(fields.get("role", "-")),
                     dataset_format=str(dataset.get("format", "")) if isinstance(dataset, dict) else "",
                     arrays=tuple(sorted(p.name for p in path.iterdir() if (p / "zarr.json").is_file())))


def describe_partial(store: EmbeddingStore, key: str) -> EntryInfo:
    path = store.partial_path(key)
    try:
        progress = json.loads((path / "progress.json").read_text())
    except (OSError, ValueError):
        progress = {}
    mtime = path.stat().st_mtime
    return EntryInfo(key=key, kind="partial", model="?", dataset="-", split="-", count=int(progress.get("rows", 0)),
                     dim=0, dtype="float32", bytes=folder_bytes(path), created=_iso(mtime), last_used=_iso(mtime),
                     complete=False)


def list_entries(store: EmbeddingStore, include_partial: bool = True) -> list[EntryInfo]:
    infos = [describe(store, k) for k in store.keys()]
    if include_partial:
        infos += [describe_partial(store, k) for k in store.partial_keys()]
    return infos


def parse_size(text: str) -> int:
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(f"max_size: {text!r} is not a size (expected e.g. 500MB, 20GB)")
    return int(float(m[1]) * 1024 ** " KMGT".index((m[2] or " ").upper()))


def parse_age(text: str) -> float:
    m = _AGE.match(text)
    if not m:
        raise ConfigError(f"older_than: {text!r} is not an age (expected e.g. 12h, 30d, 2w)")
    return float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m[2].lower()]


def select_garbage(infos: list[EntryInfo], older_than: float | None = None, max_bytes: int | None = None,
                   pattern: str | None = None, now: float | None = None) -> list[EntryInfo]:
    """Entries to delete: unused for longer than ``older_than`` seconds, matching ``pattern`` (glob over key, model,
    dataset, kind), then least recently used ones until the rest fits in ``max_bytes``."""
    now = time.time() if now is None else now
    chosen: dict[str, EntryInfo] = {}
    for info in infos:
        last = datetime.strptime(info.last_used, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        if older_than is not None and now - last > older_than:
            chosen[info.key] = info
        if pattern is not None and any(fnmatch.fnmatch(v, pattern) for v in (info.key, info.model, info.dataset,
                                                                               info.kind)):
            chosen[info.key] = info
    if max_bytes is not None:
        remaining = [i for i in infos if i.key not in chosen]
        total = sum(i.bytes for i in remaining)
        for info in sorted(remaining, key=lambda i: i.last_used):
            if total <= max_bytes:
                break
            chosen[info.key] = info
            total -= info.bytes
    return list(chosen.values())


def cache_root_size(root: Path) -> int:
    folder = as_path(root) / "embeddings"
    return folder_bytes(folder) if folder.exists() else 0
