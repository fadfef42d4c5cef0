"""Reading a complete cache entry: arrays whole or in row blocks, each block checked against its seal as it is read."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import zarr

from clipcache.storage.cache_keys import EmbeddingRef, block_matches, cache_command
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.hashing import digest
from clipcache.storage.paths import AnyPath, url

ATTRS_SEAL = "attrs_sha256"


def seal_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` plus the digest of everything else in them: a changed byte in the metadata is found on open."""
    body = {k: v for k, v in attrs.items() if k != ATTRS_SEAL}
    return {**body, ATTRS_SEAL: digest(body)}


class EmbeddingEntry:
    """A complete entry opened for reading. Every read checks the row blocks it returns against their SHA-256 seals;
    entries written before arrays other than ``embeddings`` were sealed (clipcache 0.1) have those unchecked."""

    def __init__(self, path: AnyPath, attrs: dict[str, Any]):
        self.path = path
        self.attrs = attrs
        self._group = zarr.open_group(url(path), mode="r", zarr_format=3)

    @property
    def key(self) -> str:
        return self.attrs["key"]

    def remedy(self, action: str = "verify --delete") -> str:
        """The command that deletes this entry, as a user can paste it (``<root>/embeddings/<key>.zarr``)."""
        return cache_command(self.path.parent.parent, action, self.key)

    @property
    def kind(self) -> str:
        return self.attrs.get("kind", "?")

    @property
    def count(self) -> int:
        return int(self.attrs["count"])

    @property
    def dim(self) -> int:
        return int(self.attrs["dim"])

    @property
    def chunk_rows(self) -> int:
        return int(self.attrs.get("chunk_rows", 4096))

    @property
    def meta(self) -> dict[str, Any]:
        return self.attrs.get("meta", {})

    def array_names(self) -> list[str]:
        return sorted(self._group.array_keys())

    def seals(self, name: str) -> list[str] | None:
        """Block digests of array ``name``; None for an unsealed array of a legacy entry."""
        stored = self.attrs.get("chunk_seals", self.attrs.get("chunk_sha256"))  # chunk_sha256: entries sealed with SHA-256 before
        if isinstance(stored, list):  # clipcache 0.1: embeddings only
            return stored if name == "embeddings" else None
        return (stored or {}).get(name)

    def _zarr_array(self, name: str) -> Any:
        if name not in self._group:
            raise CacheIntegrityError(f"cache entry {self.key} has no array {name!r} ({self.path}); delete the entry "
                                      f"(`{self.remedy()}`) and run the evaluation again")
        return self._group[name]

    def _file_of(self, name: str, row: int) -> str:
        arr = self._zarr_array(name)
        index = row // arr.chunks[0]
        return str(self.path / name / "c" / "/".join([str(index)] + ["0"] * (arr.ndim - 1)))

    def _damaged(self, name: str, block: int) -> CacheIntegrityError:
        where = self._file_of(name, block * self.chunk_rows)
        return CacheIntegrityError(f"cache entry {self.key} is damaged: {where} (array {name!r}, rows from "
                                   f"{block * self.chunk_rows}) fails its checksum; delete the entry with "
                                   f"`{self.remedy()}` and run the evaluation again "
                                   f"to re-encode it")

    def _read(self, name: str, lo: int, hi: int) -> np.ndarray:
        try:
            return np.asarray(self._zarr_array(name)[lo:hi])
        except CacheIntegrityError:
            raise
        except Exception as e:  # zarr/numcodecs raise assorted errors on truncated or missing chunk files
            raise CacheIntegrityError(f"cache entry {self.key} cannot be read: array {name!r} rows {lo}..{hi - 1} "
                                      f"({type(e).__name__}: {e}); delete it with `{self.remedy()}` "
                                      f"and run the evaluation again") from e

    def array(self, name: str, verify: bool = True) -> np.ndarray:
        """The whole array, every block checked (on a few threads: hashlib releases the GIL)."""
        expected = int(self.attrs.get("lengths", {}).get(name, self.count))
        data = self._read(name, 0, expected)
        if len(data) != expected or self._zarr_array(name).shape[0] != expected:
            raise CacheIntegrityError(f"cache entry {self.key}: array {name!r} has {self._zarr_array(name).shape[0]} "
                                      f"rows, expected {expected} ({self.path / name})")
        seals = self.seals(name) if verify else None
        if seals:
            rows = self.chunk_rows
            blocks = [data[i * rows : (i + 1) * rows] for i in range(len(seals))]
            if -(-len(data) // rows) != len(seals):  # rows no seal covers, or seals of missing rows
                raise self._damaged(name, min(-(-len(data) // rows), len(seals)))
            with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
                found = list(pool.map(block_matches, blocks, seals))
            if not all(found):
                raise self._damaged(name, found.index(False))
        return data

    def embeddings(self, verify: bool = True) -> np.ndarray:
        return self.array("embeddings", verify)

    @property
    def has_norms(self) -> bool:
        """Whether the entry keeps each row's L2 norm before normalisation (entries written before clipcache kept
        them, sharded encodes and models that return normalised vectors do not)."""
        return "norms" in self._group

    def norms(self, needed_by: str, verify: bool = True) -> np.ndarray:
        """Each row's L2 norm before normalisation (float32); an entry without them is one line naming the remedy."""
        if not self.has_norms:
            raise CacheIntegrityError(
                f"cache entry {self.key} keeps no norms (written before clipcache kept each row's norm, or by a model "
                f"that returns normalised vectors) and {needed_by} needs the raw features; delete it with "
                f"`{self.remedy('rm')}` and run the evaluation again to re-encode it")
        return self.array("norms", verify)

    @property
    def has_raw(self) -> bool:
        """Whether the entry keeps the raw rows themselves (the model's float32 output before normalisation, bit for
        bit); entries without them rebuild raw features as normalised row x norm (equal within ~1e-7 relative)."""
        return "raw" in self._group

    def raw_embeddings(self, needed_by: str, verify: bool = True) -> np.ndarray:
        """The features before L2 normalisation: the stored raw rows where the entry keeps them, else each
        normalised row times its norm (float32; entries of earlier releases, and writers that keep norms only)."""
        if self.has_raw:
            return self.array("raw", verify)
        return self.embeddings(verify) * self.norms(needed_by, verify)[:, None]

    def blocks(self, name: str, min_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, rows) in blocks of at least ``min_rows`` rows (whole checksum blocks), each checked as read;
        the memory held is one block, never the array."""
        rows = self.chunk_rows
        step = max(rows, -(-min_rows // rows) * rows)
        seals = self.seals(name)
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            for lo in range(0, self.count, step):
                hi = min(lo + step, self.count)
                data = self._read(name, lo, hi)
                if seals:
                    first = lo // rows
                    pieces = [data[b - lo : b - lo + rows] for b in range(lo, hi, rows)]
                    wanted = seals[first : first + len(pieces)]
                    if len(wanted) != len(pieces):  # rows that no seal covers
                        raise self._damaged(name, first + len(wanted))
                    found = list(pool.map(block_matches, pieces, wanted))
                    if not all(found):
                        raise self._damaged(name, first + found.index(False))
                yield lo, data

    def verify(self) -> list[str]:
        """Every problem found: each array's length and block seals."""
        problems = []
        for name in self.array_names():
            try:
                values = self.array(name)
            except CacheIntegrityError as e:
                problems.append(str(e))
                continue
            if name == "embeddings" and values.dtype.kind == "f" and not np.isfinite(values).all():
                row = int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0])
                problems.append(f"cache entry {self.key}: non-finite embedding at row {row} ({self.path})")
            if name == "norms" and not (np.isfinite(values) & (values >= 0)).all():
                row = int(np.flatnonzero(~(np.isfinite(values) & (values >= 0)))[0])
                problems.append(f"cache entry {self.key}: invalid norm at row {row} ({self.path})")
        return problems

    def ref(self) -> EmbeddingRef:
        return EmbeddingRef(url(self.path.parent.parent), self.key, self.kind, self.count, self.dim)
