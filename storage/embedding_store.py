"""The embedding cache: one Zarr group per entry, addressed by the digest of everything that changes its vectors.

Layout under the store root::

    embeddings/<key>.zarr/          a complete entry (immutable once published)
        embeddings                  float32 (rows, dim), L2-normalised, chunked by CHUNK_ROWS rows, uncompressed
        position                    int64 (rows,): the input position each row came from (sample / caption / prompt)
        <aux arrays>                per-row data the scorer needs (targets, caption -> sample index, ...)
        zarr.json attributes        key, key_fields, count, dim, per-chunk SHA-256, created_at, extra metadata
    embeddings/<key>.partial.zarr/  an entry being written; progress.json says how much is committed (a sharded
                                    encode keeps plan.json and shards/<lo>-<hi>.json there instead)
    locks/<key>.lock                one writer per key

Why this shape: a complete entry appears only through a directory rename, so a half-written entry is never readable as
complete; a writer commits whole chunks and records them in ``progress.json`` (itself replaced atomically), so a crash
costs at most the rows not yet committed; checksums per chunk find a damaged file on read. On an object store, which
cannot rename, an entry is written in place and becomes complete when its group metadata (count, checksums) is
uploaded last: one object, so readers see all or nothing. Embeddings do not compress
(zstd saves ~9% at half the speed), so chunks are stored raw: reads run at disk speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from clipcache.storage.atomic import atomic_write_json
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.hashing import canonical_json, digest
from clipcache.storage.paths import AnyPath, as_path, is_remote, lock, rmtree, tree_bytes, url

CHUNK_ROWS = 4096
USAGE_DIR = "usage"  # usage/<key>: empty marker file whose mtime is the last read of the entry
# Bump when the meaning of stored vectors changes (normalisation, dtype, row order...): old entries stop matching.
EMBEDDING_SPEC_VERSION = 1


@dataclass(frozen=True)
class EmbeddingRef:
    """A small, picklable reference to a complete cache entry (what tasks pass around instead of arrays)."""

    root: str
    key: str
    kind: str
    count: int
    dim: int


@dataclass(frozen=True)
class AuxSpec:
    dtype: str
    trailing_shape: tuple[int, ...] = ()


def entry_key(key_fields: dict[str, Any]) -> str:
    return digest({**key_fields, "embedding_spec_version": EMBEDDING_SPEC_VERSION})


def _chunk_digest(block: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(block).tobytes()).hexdigest()


class EmbeddingEntry:
    """A complete, verified entry opened for reading."""

    def __init__(self, path: AnyPath, attrs: dict[str, Any]):
        self.path = path
        self.attrs = attrs
        self._group = zarr.open_group(url(path), mode="r", zarr_format=3)

    @property
    def key(self) -> str:
        return self.attrs["key"]

    @property
    def count(self) -> int:
        return int(self.attrs["count"])

    @property
    def dim(self) -> int:
        return int(self.attrs["dim"])

    @property
    def meta(self) -> dict[str, Any]:
        return self.attrs.get("meta", {})

    def embeddings(self, verify: bool = True) -> np.ndarray:
        data = np.asarray(self._group["embeddings"][...])
        if verify:
            expected = self.attrs["chunk_sha256"]
            blocks = [data[i * CHUNK_ROWS : (i + 1) * CHUNK_ROWS] for i in range(len(expected))]
            # hashlib releases the GIL on large buffers: checksum chunks on a few threads.
            with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
                digests = list(pool.map(_chunk_digest, blocks))
            for i, (got, want) in enumerate(zip(digests, expected, strict=True)):
                if got != want:
                    raise CacheIntegrityError(
                        f"cache entry {self.key} is damaged: chunk {i} of {self.path / 'embeddings'} fails its checksum; "
                        f"delete {self.path} and run the evaluation again to re-encode it"
                    )
        return data

    def array(self, name: str) -> np.ndarray:
        if name not in self._group:
            raise CacheIntegrityError(f"cache entry {self.key} has no array {name!r} ({self.path})")
        return np.asarray(self._group[name][...])

    def ref(self) -> EmbeddingRef:
        return EmbeddingRef(url(self.path.parent.parent), self.key, self.attrs["kind"], self.count, self.dim)


def folder_bytes(path: AnyPath) -> int:
    return tree_bytes(path)


def _complete_attrs(path: AnyPath) -> dict[str, Any] | None:
    """The attributes of a published entry written in place (object stores), None while it is being written."""
    try:
        attrs = json.loads((path / "zarr.json").read_text()).get("attributes", {})
    except (OSError, ValueError):
        return None
    return attrs if "chunk_sha256" in attrs else None


class EmbeddingStore:
    def __init__(self, root: str | Path):
        self.root = as_path(root)
        # Object stores cannot rename a folder: entries are written where they will live (see the module docstring).
        self.in_place = is_remote(self.root)

    def entry_path(self, key: str) -> AnyPath:
        return self.root / "embeddings" / f"{key}.zarr"

    def partial_path(self, key: str) -> AnyPath:
        if self.in_place:
            return self.entry_path(key)
        return self.root / "embeddings" / f"{key}.partial.zarr"

    def lock(self, key: str):
        return lock(self.root / "locks" / f"{key}.lock")

    def has(self, key: str) -> bool:
        if self.in_place:
            return _complete_attrs(self.entry_path(key)) is not None
        return (self.entry_path(key) / "zarr.json").exists()

    def last_used(self, key: str) -> float:
        marker = self.root / USAGE_DIR / key
        return (marker if marker.exists() else self.entry_path(key) / "zarr.json").stat().st_mtime

    def touch(self, key: str) -> None:
        """Record that an entry was used now (``last_used`` for ``cache ls`` and age-based ``cache gc``)."""
        marker = self.root / USAGE_DIR / key
        try:
            marker.parent.mkdir(exist_ok=True)
            marker.touch()
        except OSError:
            pass  # a read-only cache still works; it just cannot record use

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
        matches = [k for k in self.keys() if k.startswith(prefix)]
        if len(matches) != 1:
            found = "no entry" if not matches else f"{len(matches)} entries"
            raise CacheIntegrityError(f"{found} in {self.root} with a key starting with {prefix!r}")
        return matches[0]

    def remove(self, key: str) -> int:
        """Delete an entry (complete or partial) under its lock; returns the bytes freed."""
        freed = 0
        with self.lock(key):
            # written in place (object stores), the partial entry and the entry are one folder
            for path in [self.entry_path(key)] + ([] if self.in_place else [self.partial_path(key)]):
                if path.exists():
                    freed += folder_bytes(path)
                    rmtree(path)
            (self.root / USAGE_DIR / key).unlink(missing_ok=True)
        return freed

    def verify(self, key: str) -> list[str]:
        """Problems found in an entry: unreadable metadata, key mismatch, chunk checksum failures, short arrays."""
        try:
            entry = self.open(key)
            entry.embeddings(verify=True)
            for name in entry._group.array_keys():
                if entry._group[name].shape[0] != entry.count:
                    return [f"array {name!r} has {entry._group[name].shape[0]} rows, expected {entry.count}"]
        except CacheIntegrityError as e:
            return [str(e)]
        except Exception as e:  # zarr/numcodecs raise assorted errors on damaged files; each is a finding here
            return [f"cache entry {key} cannot be read: {type(e).__name__}: {e}"]
        return []

    def open(self, key: str, key_fields: dict[str, Any] | None = None) -> EmbeddingEntry:
        """Open a complete entry; if ``key_fields`` is given, check the stored key is the one asked for."""
        path = self.entry_path(key)
        if self.in_place and not self.has(key):
            raise CacheIntegrityError(f"no complete cache entry {key} under {self.root}")
        try:
            attrs = dict(zarr.open_group(url(path), mode="r", zarr_format=3).attrs)
        except (FileNotFoundError, zarr.errors.GroupNotFoundError) as e:
            raise CacheIntegrityError(f"no complete cache entry {key} under {self.root}") from e
        except (ValueError, json.JSONDecodeError) as e:
            raise CacheIntegrityError(f"cache entry {key} has unreadable metadata ({path}): {e}") from e
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


class EntryWriter:
    """Writes one entry chunk by chunk; resumable after a crash. Use as a context manager (holds the key's lock).

    ``start_position`` tells the caller where to resume its input stream; rows are given with their input positions.
    """

    def __init__(self, store: EmbeddingStore, key_fields: dict[str, Any], kind: str, capacity: int,
                 aux: dict[str, AuxSpec]):
        self.store = store
        self.key_fields = key_fields
        self.key = entry_key(key_fields)
        self.kind = kind
        self.dim: int | None = None
        self.capacity = max(int(capacity), 1)
        self.aux = aux
        self._lock = store.lock(self.key)
        self._buffers: dict[str, list[np.ndarray]] = {}
        self.rows_committed = 0
        self.start_position = 0
        self.chunk_sha256: list[str] = []
        self.resumed = False

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def __enter__(self) -> EntryWriter:
        self._lock.acquire()
        try:
            self.already_complete = self.store.has(self.key)
            if not self.already_complete:
                self._resume_or_reset()
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    @property
    def partial(self) -> AnyPath:
        return self.store.partial_path(self.key)

    def _progress_path(self) -> AnyPath:
        return self.partial / "progress.json"

    def _resume_or_reset(self) -> None:
        progress = self._read_progress()
        if progress is not None:
            self.rows_committed = progress["rows"]
            self.start_position = progress["next_position"]
            self.chunk_sha256 = list(progress["chunk_sha256"])
            self.dim = int(zarr.open_group(url(self.partial), mode="r", zarr_format=3)["embeddings"].shape[1])
            self.resumed = self.rows_committed > 0
        elif self.partial.exists():
            rmtree(self.partial)  # leftovers from before the first committed progress: nothing to trust

    def _create_arrays(self, dim: int) -> None:
        self.dim = dim
        group = zarr.open_group(url(self.partial), mode="w", zarr_format=3)
        rows = min(CHUNK_ROWS, self.capacity)  # a small entry is one small chunk, not a padded 4,096-row one
        group.create_array("embeddings", shape=(self.capacity, dim), chunks=(rows, dim),
                           dtype="float32", compressors=None, fill_value=0.0)
        group.create_array("position", shape=(self.capacity,), chunks=(rows,), dtype="int64",
                           compressors=None, fill_value=-1)
        for name, spec in self.aux.items():
            group.create_array(name, shape=(self.capacity, *spec.trailing_shape),
                               chunks=(rows, *spec.trailing_shape), dtype=spec.dtype, compressors=None)
        self._write_progress(0, 0)

    def _read_progress(self) -> dict[str, Any] | None:
        try:
            progress = json.loads(self._progress_path().read_text())
        except (OSError, ValueError):
            return None
        if progress.get("key") != self.key or progress.get("capacity") != self.capacity:
            return None
        return progress

    def _write_progress(self, rows: int, next_position: int) -> None:
        atomic_write_json(self._progress_path(), {
            "key": self.key, "capacity": self.capacity, "rows": rows,
            "next_position": next_position, "chunk_sha256": self.chunk_sha256,
        })

    # -- writing ---------------------------------------------------------------------------------------------------
    def add(self, embeddings: np.ndarray, positions: np.ndarray, **aux: np.ndarray) -> None:
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if self.dim is None and embeddings.ndim == 2:
            self._create_arrays(embeddings.shape[1])
        if embeddings.ndim != 2 or embeddings.shape[1] != self.dim:
            raise ValueError(f"expected embeddings of shape (n, {self.dim}), got {embeddings.shape}")
        if set(aux) != set(self.aux):
            raise ValueError(f"expected auxiliary arrays {sorted(self.aux)}, got {sorted(aux)}")
        self._buffers.setdefault("embeddings", []).append(embeddings)
        self._buffers.setdefault("position", []).append(np.asarray(positions, dtype=np.int64))
        for name, values in aux.items():
            self._buffers.setdefault(name, []).append(np.asarray(values, dtype=self.aux[name].dtype))
        if sum(len(b) for b in self._buffers["embeddings"]) >= CHUNK_ROWS:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self._buffers:
            return
        merged = {name: np.concatenate(parts) for name, parts in self._buffers.items()}
        n = len(merged["embeddings"])
        n_write = n if final else (n // CHUNK_ROWS) * CHUNK_ROWS
        if n_write == 0:
            return
        start, stop = self.rows_committed, self.rows_committed + n_write
        if stop > self.capacity:
            raise ValueError(f"entry {self.key}: {stop} rows exceed the declared capacity {self.capacity}")
        group = zarr.open_group(url(self.partial), mode="r+", zarr_format=3)
        for name, values in merged.items():
            group[name][start:stop] = values[:n_write]
        emb = merged["embeddings"][:n_write]
        for offset in range(0, n_write, CHUNK_ROWS):
            self.chunk_sha256.append(_chunk_digest(emb[offset : offset + CHUNK_ROWS]))
        self.rows_committed = stop
        self.start_position = int(merged["position"][n_write - 1]) + 1
        self._write_progress(self.rows_committed, self.start_position)
        self._buffers = {name: [values[n_write:]] for name, values in merged.items()} if n_write < n else {}

    def finish(self, meta: dict[str, Any] | None = None) -> EmbeddingRef:
        """Flush, trim to the rows written, record metadata and publish the entry atomically."""
        self._flush(final=True)
        if self.dim is None:
            raise ValueError(f"entry {self.key}: nothing was written")
        return publish_entry(self.store, self.key_fields, self.kind, self.rows_committed, self.dim,
                             ["embeddings", "position", *self.aux], self.chunk_sha256, meta)


def publish_entry(store: EmbeddingStore, key_fields: dict[str, Any], kind: str, rows: int, dim: int,
                  arrays: list[str], chunk_sha256: list[str] | None, meta: dict[str, Any] | None,
                  scratch: tuple[str, ...] = ("progress.json",)) -> EmbeddingRef:
    """Trim the partial entry's arrays to ``rows``, write the metadata and make the entry complete: a directory
    rename locally; on an object store the metadata upload itself is the commit. ``scratch`` files go afterwards.
    ``chunk_sha256=None``: checksum the stored rows now (writers that did not see every row, e.g. sharded ones)."""
    key = entry_key(key_fields)
    partial = store.partial_path(key)
    group = zarr.open_group(url(partial), mode="r+", zarr_format=3)
    for name in arrays:
        arr = group[name]
        arr.resize((rows, *arr.shape[1:]))
    if chunk_sha256 is None:
        stored = group["embeddings"]
        chunk_sha256 = [_chunk_digest(np.asarray(stored[lo : lo + CHUNK_ROWS])) for lo in range(0, rows, CHUNK_ROWS)]
    group.attrs.update({
        "key": key,
        "key_fields": key_fields,
        "kind": kind,
        "count": rows,
        "dim": dim,
        "dtype": "float32",
        "chunk_rows": CHUNK_ROWS,
        "chunk_sha256": chunk_sha256,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "meta": meta or {},
    })
    final = store.entry_path(key)
    if not store.in_place:
        partial.rename(final)
    for name in scratch:
        target = final / name
        if target.exists():
            if target.is_dir():
                rmtree(target)
            else:
                target.unlink()
    return EmbeddingRef(url(store.root), key, kind, rows, dim)
