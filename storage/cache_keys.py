"""What names a cache entry and what a reference to one carries: keys, references, per-row array specs, checksums.

A key is the digest of everything that changes the stored vectors (``key_fields``), plus the embedding-spec version.
Every array of an entry is sealed with a checksum of each of its row blocks (``chunk_rows`` rows each), so a changed
byte in any array, not only in the embeddings, is found on read and by ``cache verify``. Seals are CRC32C
(``crc32c:<hex>``): it finds the random corruption a cache meets (bit rot, truncated or swapped chunk files) like
SHA-256 does, at about a tenth of the cost on every read (benchmarks/cache_read.py); nothing here defends against a
deliberate forgery, which no checksum stored beside the data could. Entries written before carry SHA-256 seals
(bare hex) and are still verified with SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np

from clipcache.storage.hashing import digest

# Bump when the meaning of stored vectors changes (normalisation, dtype, row order...): old entries stop matching.
EMBEDDING_SPEC_VERSION = 1
DEFAULT_CHUNK_ROWS = 4096
# Commit a partial entry at least this often while encoding: a kill loses at most this much work (or one chunk).
DEFAULT_COMMIT_SECONDS = 30.0


def chunk_rows_setting() -> int:
    """Rows per Zarr chunk and per checksum block of new entries (``CLIPCACHE_CHUNK_ROWS``; tests make it small)."""
    return max(1, int(os.environ.get("CLIPCACHE_CHUNK_ROWS", DEFAULT_CHUNK_ROWS)))


def commit_seconds_setting() -> float:
    return max(0.0, float(os.environ.get("CLIPCACHE_COMMIT_SECONDS", DEFAULT_COMMIT_SECONDS)))


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
    """A per-row array stored beside the embeddings (targets, caption -> sample index, text digests...)."""

    dtype: str
    trailing_shape: tuple[int, ...] = ()


def cache_command(root: str | os.PathLike[str], action: str, *keys: str) -> str:
    """The ``clipcache cache`` command that does ``action`` (``rm``, ``verify --delete``) to ``keys`` in the cache at
    ``root``; a cache other than the default one is named, so the command works as printed."""
    where = "" if str(root) == "cache" else f" --cache_dir {shlex.quote(str(root))}"
    return f"clipcache cache {action}{where} {' '.join(k[:12] for k in keys)}"


def entry_key(key_fields: dict[str, Any]) -> str:
    return digest({**key_fields, "embedding_spec_version": EMBEDDING_SPEC_VERSION})


SEAL_ALGORITHM = "crc32c"


def block_digest(block: np.ndarray, algorithm: str = SEAL_ALGORITHM) -> str:
    data = np.ascontiguousarray(block).tobytes()
    if algorithm == "crc32c":
        return f"crc32c:{google_crc32c.value(data):08x}"
    return hashlib.sha256(data).hexdigest()


def block_matches(block: np.ndarray, seal: str) -> bool:
    """Whether ``block`` still has the checksum ``seal`` (CRC32C, or SHA-256 for entries of earlier releases)."""
    return block_digest(block, "crc32c" if seal.startswith("crc32c:") else "sha256") == seal


def block_digests(values: np.ndarray, chunk_rows: int) -> list[str]:
    return [block_digest(values[lo : lo + chunk_rows]) for lo in range(0, len(values), chunk_rows)]
