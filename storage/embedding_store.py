"""The embedding cache: one Zarr group per entry, addressed by the digest of everything that changes its vectors.

Layout under the store root::

    embeddings/<key>.zarr/          a complete entry (immutable once published)
        embeddings                  float32 (rows, dim), L2-normalised, chunked by chunk_rows rows, uncompressed
        norms                       float32 (rows,): each row's L2 norm before normalisation, where the model gave it
        position                    int64 (rows,): the input position each row came from (sample / caption / prompt)
        <aux arrays>                per-row data the scorer needs (targets, caption -> sample index, ...)
        zarr.json attributes        key, key_fields, count, dim, per-array block SHA-256 seals, created_at, metadata,
                                    and a seal of the attributes themselves
    embeddings/<key>.partial.zarr/  an entry being written; progress.json says how much is committed (a sharded
                                    encode keeps plan.json and shards/<lo>-<hi>.json there instead)
    locks/<key>.lock                one writer per key
    usage/<key>                     empty marker whose mtime is the entry's last read

Why this shape: a complete entry appears only through a directory rename, so a half-written entry is never readable
as complete; a writer commits by rows and by time (storage/cache_writer.py), so a crash costs little; seals on every
array find a damaged file on read. On an object store, which cannot rename, an entry is written in place and becomes
complete when its group metadata (count, seals) is uploaded last: one object, so readers see all or nothing.
Embeddings do not compress (zstd saves ~9% at half the speed), so chunks are stored raw: reads run at disk speed.
Reading (storage/cache_entry.py) and writing (storage/cache_writer.py) live in their own modules.
"""

from __future__ import annotations

import json
import os
from typing import Any

import zarr

from clipcache.storage.cache_entry import ATTRS_SEAL, EmbeddingEntry, seal_attrs
from clipcache.storage.cache_keys import AuxSpec, cache_command, chunk_rows_setting, entry_key
from clipcache.storage.cache_writer import EntryWriter
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.hashing import canonical_json
from clipcache.storage.paths import AnyPath, as_path, is_remote, lock, rmtree, touch, tree_bytes, url

USAGE_DIR = "usage"  # usage/<key>: empty marker file whose mtime is the last read of the entry


def folder_bytes(path: AnyPath) -> int:
    return tree_bytes(path)


def _complete_attrs(path: AnyPath) -> dict[str, Any] | None:
    """The attributes of a published entry written in place (object stores), None while it is being written."""
    try:
        attrs = json.loads((path / "zarr.json").read_text()).get("attributes", {})
    except (OSError, ValueError):
        return None
    return attrs if "chunk_seals" in attrs or "chunk_sha256" in attrs else None


class EmbeddingStore:
    def __init__(self, root: str | os.PathLike, chunk_rows: int | None = None):
        self.root = as_path(root)
        self.chunk_rows = chunk_rows or chunk_rows_setting()
        # Object stores cannot rename a folder: entries are written where they will live (see the module docstring).
        self.in_place = is_remote(self.root)

    def entry_path(self, key: str) -> AnyPath:
        return self.root / "embeddings" / f"{key}.zarr"

    def partial_path(self, key: str) -> AnyPath:
        if self.in_place:
            return self.entry_path(key)
        return self.root / "embeddings" / f"{key}.partial.zarr"

    def lock(self, key: str) -> Any:
        return lock(self.root / "locks" / f"{key}.lock")

    def has(self, key: str) -> bool:
        if self.in_place:
            return _complete_attrs(self.entry_path(key)) is not None
        return (self.entry_path(key) / "zarr.json").exists()

    def last_used(self, key: str) -> float:
        marker = self.root / USAGE_DIR / key
        return float((marker if marker.exists() else self.entry_path(key) / "zarr.json").stat().st_mtime)

    def touch(self, key: str) -> None:
        """Record that an entry was used now (``last_used`` for ``cache ls`` and age-based ``cache gc``)."""
        touch(self.root / USAGE_DIR / key)

    def _listed(self) -> list[str]:
        folder = self.root / "embeddings"
        return [p.name for p in folder.iterdir()] if folder.exists() else []

    def keys(self) -> list[str]:
        names = [n[: -len(".zarr")] for n in self._listed() if n.endswith(".zarr") and not n.endswith(".partial.zarr")]
        return sorted(k for k in names if not self.in_place or self.has(k))

    def partial_keys(self) -> list[str]:
        if self.in_place:
            return sorted(n[: -len(".zarr")] for n in self._listed() if n.endswith(".zarr")
                          and not self.has(n[: -len(".zarr")]))
        return sorted(n[: -len(".partial.zarr")] for n in self._listed() if n.endswith(".partial.zarr"))

    def resolve_prefix(self, prefix: str) -> str:
        """A full key from a unique prefix (as git does with commit ids)."""
        matches = [k for k in self.keys() + self.partial_keys() if k.startswith(prefix)]
        if len(set(matches)) != 1:
            found = "no entry" if not matches else f"{len(matches)} entries"
            raise CacheIntegrityError(f"{found} in {self.root} with a key starting with {prefix!r}")
        return matches[0]

    def remove(self, key: str, wait: bool = True, partial_only: bool = False) -> int | None:
        """Delete an entry (complete and partial, or with ``partial_only`` the partial one only) under its lock;
        returns the bytes freed. ``wait=False``: an entry whose lock a running encode holds is left alone (None)."""
        from filelock import Timeout

        freed = 0
        held = self.lock(key)
        try:
            held.acquire(timeout=-1 if wait else 0)
        except Timeout:
            return None
        try:
            if self.in_place:  # written in place (object stores): the partial entry and the entry are one folder
                if partial_only and self.has(key):
                    return 0  # published meanwhile: not partial any more
                paths = [self.entry_path(key)]
            else:
                paths = [self.partial_path(key)] if partial_only else [self.entry_path(key), self.partial_path(key)]
            for path in paths:
                if path.exists():
                    freed += folder_bytes(path)
                    rmtree(path)
            if not partial_only:
                (self.root / USAGE_DIR / key).unlink(missing_ok=True)
        finally:
            held.release()
        return freed

    def verify(self, key: str) -> list[str]:
        """Problems found in an entry: unreadable or altered metadata, key mismatch, any array failing its seals."""
        try:
            return self.open(key).verify()
        except CacheIntegrityError as e:
            return [str(e)]

    def _attrs(self, key: str) -> dict[str, Any]:
        path = self.entry_path(key)
        if self.in_place and not self.has(key):
            raise CacheIntegrityError(f"no complete cache entry {key} under {self.root}")
        try:
            return dict(zarr.open_group(url(path), mode="r", zarr_format=3).attrs)
        except (FileNotFoundError, zarr.errors.GroupNotFoundError) as e:
            if path.exists():  # the folder is there but its metadata is gone: damaged, not missing
                raise CacheIntegrityError(f"cache entry {key} is damaged: {path / 'zarr.json'} is missing; delete "
                                          f"it with `{cache_command(self.root, 'verify --delete', key)}` and run the "
                                          f"evaluation again") from e
            raise CacheIntegrityError(f"no complete cache entry {key} under {self.root}") from e
        except (ValueError, json.JSONDecodeError, OSError) as e:
            raise CacheIntegrityError(f"cache entry {key} has unreadable metadata ({path / 'zarr.json'}): {e}; delete "
                                      f"it with `{cache_command(self.root, 'verify --delete', key)}`") from e

    def open(self, key: str, key_fields: dict[str, Any] | None = None) -> EmbeddingEntry:
        """Open a complete entry; check its metadata seal and stored key, and (if given) that it holds the data of
        ``key_fields``."""
        attrs = self._attrs(key)
        path = self.entry_path(key)
        if ATTRS_SEAL in attrs and seal_attrs(attrs)[ATTRS_SEAL] != attrs[ATTRS_SEAL]:
            raise CacheIntegrityError(f"cache entry {key} is damaged: the attributes in {path / 'zarr.json'} were "
                                      f"changed after it was written; delete it with "
                                      f"`{cache_command(self.root, 'verify --delete', key)}` and run the evaluation "
                                      f"again")
        stored_fields = attrs.get("key_fields")
        if attrs.get("key") != key or stored_fields is None or entry_key(stored_fields) != key:
            raise CacheIntegrityError(f"cache entry {path} does not hold the data of key {key} (stored key mismatch)")
        if key_fields is not None and canonical_json(stored_fields) != canonical_json(key_fields):
            raise CacheIntegrityError(f"cache entry {key} was written for different inputs than requested")
        self.touch(key)
        return EmbeddingEntry(path, attrs)

    def writer(self, key_fields: dict[str, Any], kind: str, capacity: int,
               aux: dict[str, AuxSpec] | None = None) -> EntryWriter:
        """A writer for the entry of ``key_fields``; the embedding width is taken from the first rows added."""
        return EntryWriter(self, key_fields, kind, capacity, aux or {})


__all__ = ["AuxSpec", "EmbeddingEntry", "EmbeddingStore", "EntryWriter", "entry_key", "folder_bytes"]
