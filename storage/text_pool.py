"""Content-addressed text embeddings: one pool per (model identity, precision), addressed by each text's SHA-256.

A pool is a set of immutable cache entries ("batches"), each holding some texts' embeddings and a ``text_sha256``
array (rows x 32 bytes). ``pools/<pool>/<batch key>`` marker files list a pool's batches; a marker is created only
after its batch is published, so a reader never sees a half-written batch. Two processes adding overlapping texts
at once both succeed; a text found in several batches is read from the first, and the vectors are identical anyway.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from clipcache.storage.content_pool import Pool


def text_sha256(texts: list[str]) -> np.ndarray:
    """(n, 32) uint8: the SHA-256 of each text's UTF-8 bytes."""
    return np.frombuffer(b"".join(hashlib.sha256(t.encode("utf-8")).digest() for t in texts),
                         dtype=np.uint8).reshape(len(texts), 32)


@dataclass(frozen=True)
class PoolLookup:
    """Where each requested text's vector lives: ``batch_keys[batch[i]]``, row ``row[i]`` (small; no arrays of
    embeddings)."""

    batch_keys: tuple[str, ...]
    batch: np.ndarray
    row: np.ndarray


class TextPool(Pool):
    digest_array = "text_sha256"

    def missing(self, texts: list[str]) -> list[str]:
        """Distinct texts not in the pool yet, in first-seen order."""
        known = self.index()
        seen: set[bytes] = set()
        out = []
        for text, sha in zip(texts, text_sha256(texts), strict=True):
            digest = sha.tobytes()
            if digest not in known and digest not in seen:
                seen.add(digest)
                out.append(text)
        return out

    def lookup(self, texts: list[str]) -> PoolLookup:
        known = self.index()
        keys: list[str] = []
        batch = np.empty(len(texts), dtype=np.int64)
        row = np.empty(len(texts), dtype=np.int64)
        for i, (text, sha) in enumerate(zip(texts, text_sha256(texts), strict=True)):
            hit = known.get(sha.tobytes())
            if hit is None:
                raise KeyError(text)
            if hit[0] not in keys:
                keys.append(hit[0])
            batch[i], row[i] = keys.index(hit[0]), hit[1]
        return PoolLookup(tuple(keys), batch, row)

    def gather(self, lookup: PoolLookup) -> np.ndarray:
        """The embeddings of the looked-up texts, in request order."""
        parts = [self.store.open(key).embeddings() for key in lookup.batch_keys]
        dim = parts[0].shape[1]
        out = np.empty((len(lookup.batch), dim), dtype=np.float32)
        for b, part in enumerate(parts):
            mask = lookup.batch == b
            out[mask] = part[lookup.row[mask]]
        return out
