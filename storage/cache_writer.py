"""Writing a cache entry: resumable, committed by rows and by time, published atomically.

A writer buffers rows and commits them to the partial entry when a whole chunk is ready or when ``commit_seconds``
have passed since the last commit (then the rows so far, even mid-chunk), so a kill loses at most that much work at
any model size. ``progress.json`` (replaced atomically) records what is committed: the rows, the next input position,
the seals of finished blocks and of the committed rows of the unfinished one. A resumed writer checks those rows
against their seal (a kill while a chunk file was being rewritten can damage them) and goes back to the block start
if they fail, so a resumed entry is always bit-identical to an uninterrupted one.

Rows given with their norms before normalisation (``add(..., norms=...)``, what the encode stage's models give)
keep them in a ``norms`` float32 array, written, sealed and committed with the rows: raw features are normalised
row x norm. The first rows decide whether an entry has norms; a resumed entry keeps what its partial entry has.
Rows given with the raw features themselves (``add(..., raw=...)``: the model's float32 output before
normalisation) keep them in a ``raw`` float32 array the same way, for tasks that must receive the model's output to
the last bit (row x norm differs from it in the last bits); the same first-rows and resume rules apply.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.storage import faults
from clipcache.storage.atomic import atomic_write_json
from clipcache.storage.cache_entry import seal_attrs
from clipcache.storage.cache_keys import (
    AuxSpec,
    EmbeddingRef,
    block_digest,
    block_digests,
    block_matches,
    commit_seconds_setting,
    entry_key,
)
from clipcache.storage.paths import AnyPath, rmtree, url
from clipcache.storage.zarr_io import member, open_group

if TYPE_CHECKING:  # the store imports this module
    from clipcache.storage.embedding_store import EmbeddingStore


class EntryWriter:
    """Writes one entry; use as a context manager (holds the key's lock). ``start_position`` tells the caller where
    to resume its input stream; rows are added with their input positions."""

    def __init__(self, store: EmbeddingStore, key_fields: dict[str, Any], kind: str, capacity: int,
                 aux: dict[str, AuxSpec], commit_seconds: float | None = None):
        self.store = store
        self.key_fields = key_fields
        self.key = entry_key(key_fields)
        self.kind = kind
        self.dim: int | None = None
        self.norms: bool | None = None  # whether the entry keeps each row's norm: decided by the first rows
        self.raw: bool | None = None  # whether it keeps the raw rows too: decided by the first rows
        self.capacity = max(int(capacity), 1)
        self.aux = aux
        self.chunk_rows = store.chunk_rows
        self.commit_seconds = commit_seconds_setting() if commit_seconds is None else commit_seconds
        self._lock = store.lock(self.key)
        self._pending: dict[str, list[np.ndarray]] = {}
        self._tail: dict[str, np.ndarray] = {}  # committed rows of the unfinished block, per array
        self.seals: dict[str, list[str]] = {}
        self.rows_committed = 0
        self.start_position = 0
        self.resumed = False
        self.already_complete = False
        self._last_commit = time.monotonic()

    @property
    def arrays(self) -> list[str]:
        return ["embeddings", "position", *(["norms"] if self.norms else []), *(["raw"] if self.raw else []),
                *self.aux]

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
        self._last_commit = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @property
    def partial(self) -> AnyPath:
        return self.store.partial_path(self.key)

    def _progress_path(self) -> AnyPath:
        return self.partial / "progress.json"

    def _read_progress(self) -> dict[str, Any] | None:
        try:
            progress = json.loads(self._progress_path().read_text())
        except (OSError, ValueError):
            return None
        if (progress.get("key") != self.key or progress.get("capacity") != self.capacity
                or progress.get("chunk_rows") != self.chunk_rows or not isinstance(progress.get("seals"), dict)):
            return None  # another layout (or an older release's partial entry): start over
        return progress

    def _resume_or_reset(self) -> None:
        progress = self._read_progress()
        if progress is None:
            if self.partial.exists():
                rmtree(self.partial)  # leftovers from before the first committed progress: nothing to trust
            return
        group = open_group(self.partial, "r")
        self.dim = int(member(group, "embeddings").shape[1])
        self.norms = "norms" in group  # a partial entry from before norms were kept resumes without them
        self.raw = "raw" in group  # the same for raw rows
        rows = int(progress["rows"])
        full = rows // self.chunk_rows * self.chunk_rows
        self.seals = {name: list(progress["seals"].get(name, []))[: full // self.chunk_rows] for name in self.arrays}
        tail_seals = progress.get("tail_seals", {})
        if rows > full:
            tail = {name: np.asarray(member(group, name)[full:rows]) for name in self.arrays}
            if all(n in tail_seals and block_matches(tail[n], tail_seals[n]) for n in self.arrays):
                self._tail = tail
            else:  # damaged by a kill mid-rewrite: redo the block from its start
                rows = full
        self.rows_committed = rows
        self.start_position = int(np.asarray(member(group, "position")[rows - 1])) + 1 if rows else 0
        self.resumed = rows > 0

    def _create_arrays(self, dim: int, norms: bool, raw: bool = False) -> None:
        self.dim, self.norms, self.raw = dim, norms, raw
        group = open_group(self.partial, "w")
        rows = min(self.chunk_rows, self.capacity)  # a small entry is one small chunk, not a padded full one
        group.create_array("embeddings", shape=(self.capacity, dim), chunks=(rows, dim), dtype="float32",
                           compressors=None, fill_value=0.0)
        group.create_array("position", shape=(self.capacity,), chunks=(rows,), dtype="int64", compressors=None,
                           fill_value=-1)
        if norms:
            group.create_array("norms", shape=(self.capacity,), chunks=(rows,), dtype="float32", compressors=None,
                               fill_value=0.0)
        if raw:
            group.create_array("raw", shape=(self.capacity, dim), chunks=(rows, dim), dtype="float32",
                               compressors=None, fill_value=0.0)
        for name, spec in self.aux.items():
            group.create_array(name, shape=(self.capacity, *spec.trailing_shape),
                               chunks=(rows, *spec.trailing_shape), dtype=spec.dtype, compressors=None)
        self.seals = {name: [] for name in self.arrays}
        self._write_progress()

    def _write_progress(self) -> None:
        atomic_write_json(self._progress_path(), {
            "key": self.key, "capacity": self.capacity, "chunk_rows": self.chunk_rows, "rows": self.rows_committed,
            "next_position": self.start_position, "seals": self.seals,
            "tail_seals": {name: block_digest(values) for name, values in self._tail.items() if len(values)},
        })

    # -- writing ---------------------------------------------------------------------------------------------------
    def add(self, embeddings: np.ndarray, positions: np.ndarray, norms: np.ndarray | None = None,
            raw: np.ndarray | None = None, **aux: np.ndarray) -> None:
        """Buffer rows (L2-normalised) with their input positions, their norms before normalisation when the model
        gives them, the raw rows when the caller keeps them (with norms only), and the entry's auxiliary arrays."""
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if raw is not None and norms is None:
            raise ValueError("raw rows are kept with their norms: pass both")
        if self.dim is None and embeddings.ndim == 2:
            self._create_arrays(embeddings.shape[1], norms is not None, raw is not None)
        if embeddings.ndim != 2 or embeddings.shape[1] != self.dim:
            raise ValueError(f"expected embeddings of shape (n, {self.dim}), got {embeddings.shape}")
        if set(aux) != set(self.aux):
            raise ValueError(f"expected auxiliary arrays {sorted(self.aux)}, got {sorted(aux)}")
        if norms is not None and np.shape(norms) not in ((len(embeddings),), (len(embeddings), 1)):
            raise ValueError(f"expected {len(embeddings)} norms, got an array of shape {np.shape(norms)}")
        if self.norms and norms is None:
            raise ValueError(f"entry {self.key} keeps each row's norm: rows without norms cannot join it")
        if raw is not None and np.shape(raw) != embeddings.shape:
            raise ValueError(f"expected raw rows of shape {embeddings.shape}, got {np.shape(raw)}")
        if self.raw and raw is None:
            raise ValueError(f"entry {self.key} keeps the raw rows: rows without them cannot join it")
        self._pending.setdefault("embeddings", []).append(embeddings)
        self._pending.setdefault("position", []).append(np.asarray(positions, dtype=np.int64))
        if self.norms:  # norms given to an entry resumed from before they were kept are left out, as its rows were
            self._pending.setdefault("norms", []).append(np.asarray(norms, dtype=np.float32).reshape(-1))
        if self.raw:  # raw rows given to an entry that keeps none (resumed, or its first rows had none) are left out
            self._pending.setdefault("raw", []).append(np.asarray(raw, dtype=np.float32))
        for name, values in aux.items():
            self._pending.setdefault(name, []).append(np.asarray(values, dtype=self.aux[name].dtype))
        due = time.monotonic() - self._last_commit >= self.commit_seconds
        if due or self._tail_rows() + sum(len(b) for b in self._pending["embeddings"]) >= self.chunk_rows:
            self._commit(everything=due)

    def _tail_rows(self) -> int:
        return len(self._tail.get("embeddings", ()))

    def _commit(self, everything: bool) -> None:
        """Write buffered rows: all of them, or only as many as fill whole blocks."""
        if not self._pending:
            return
        merged = {name: np.concatenate(parts) for name, parts in self._pending.items()}
        n, tail = len(merged["embeddings"]), self._tail_rows()
        n_write = n if everything else (tail + n) // self.chunk_rows * self.chunk_rows - tail
        if n_write > 0:
            start, stop = self.rows_committed, self.rows_committed + n_write
            if stop > self.capacity:
                raise ValueError(f"entry {self.key}: {stop} rows exceed the declared capacity {self.capacity}")
            group = open_group(self.partial, "r+")
            for name, values in merged.items():
                member(group, name)[start:stop] = values[:n_write]
                block = np.concatenate([self._tail[name], values[:n_write]]) if name in self._tail else values[:n_write]
                whole = len(block) // self.chunk_rows * self.chunk_rows
                self.seals[name] += block_digests(block[:whole], self.chunk_rows)
                self._tail[name] = block[whole:]
            faults.point("encode-rows")
            self.rows_committed = stop
            self.start_position = int(merged["position"][n_write - 1]) + 1
            self._write_progress()
            faults.point("encode-commit")
            self._last_commit = time.monotonic()
        self._pending = {name: [values[n_write:]] for name, values in merged.items()} if n_write < n else {}

    def finish(self, meta: dict[str, Any] | None = None,
               extra_arrays: dict[str, np.ndarray] | None = None) -> EmbeddingRef:
        """Commit everything, trim to the rows written, record metadata and publish the entry atomically.
        ``extra_arrays``: arrays of other lengths stored (and sealed) with the entry, e.g. a caption -> row map."""
        self._commit(everything=True)
        if self.dim is None:
            raise ValueError(f"entry {self.key}: nothing was written")
        seals = {name: self.seals[name] + ([block_digest(self._tail[name])] if len(self._tail.get(name, ())) else [])
                 for name in self.arrays}
        return publish_entry(self.store, self.key_fields, self.kind, rows=self.rows_committed, dim=self.dim,
                             arrays=self.arrays, seals=seals, meta=meta, extra_arrays=extra_arrays)


def publish_entry(store: EmbeddingStore, key_fields: dict[str, Any], kind: str, *, rows: int, dim: int, arrays: list[str],
                  seals: dict[str, list[str]] | None, meta: dict[str, Any] | None,
                  scratch: tuple[str, ...] = ("progress.json",),
                  extra_arrays: dict[str, np.ndarray] | None = None) -> EmbeddingRef:
    """Trim the partial entry's arrays to ``rows``, write the sealed metadata and make the entry complete: a
    directory rename locally; on an object store the metadata upload itself is the commit. ``scratch`` files go
    afterwards. ``seals=None``: seal the stored rows now (writers that did not see every row, e.g. sharded ones)."""
    key = entry_key(key_fields)
    partial = store.partial_path(key)
    group = open_group(partial, "r+")
    for name in arrays:
        arr = member(group, name)
        arr.resize((rows, *arr.shape[1:]))
    if seals is None:
        seals = {name: block_digests(np.asarray(member(group, name)[:rows]), store.chunk_rows)
                 for name in arrays}
    lengths = {}
    for name, values in (extra_arrays or {}).items():
        values = np.ascontiguousarray(values)
        chunk = (max(1, min(store.chunk_rows, len(values))), *values.shape[1:])
        group.create_array(name, shape=values.shape, chunks=chunk, dtype=values.dtype, compressors=None,
                           overwrite=True)[...] = values
        seals = {**seals, name: block_digests(values, store.chunk_rows)}
        lengths[name] = len(values)
    group.attrs.update(seal_attrs({
        "key": key,
        "key_fields": key_fields,
        "kind": kind,
        "count": rows,
        "dim": dim,
        "dtype": "float32",
        "chunk_rows": store.chunk_rows,
        "chunk_seals": seals,
        **({"lengths": lengths} if lengths else {}),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "meta": meta or {},
    }))
    final = store.entry_path(key)
    faults.point("publish")
    if not store.in_place:
        if final.exists():  # an entry whose metadata was lost (not complete, see has()): what replaces it is whole
            rmtree(final)
        partial.rename(final)
    for name in scratch:
        target = final / name
        if target.exists():
            if target.is_dir():
                rmtree(target)
            else:
                target.unlink()
    return EmbeddingRef(url(store.root), key, kind, rows, dim)
