"""Content-addressed embeddings of arbitrary inputs (images as mteb hands them over): one pool per (model identity,
preprocessing, precision), addressed by a 32-byte digest of each input's content.

The same scheme as ``storage/text_pool.py``: a pool is a set of immutable cache entries ("batches"), each holding
some inputs' embeddings and a ``content_sha256`` array (rows x 32 bytes); ``pools/<pool>/<batch key>`` marker files,
created only after their batch is published, list a pool's batches. Two processes adding overlapping inputs both
succeed; a digest found in several batches is read from the first (the vectors are the same model's on the same
content). A batch written with each row's norm before normalisation (the encode stage's ``norms`` array) gives
them back with ``gather_norms``, so raw vectors (row x norm) are known where every batch read has them; a batch
that keeps the raw rows themselves (``raw``) gives the model's output bit for bit through ``gather_raw``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from clipcache.storage.embedding_store import EmbeddingStore

DIGEST_ARRAY = "content_sha256"


def digests_array(digests: list[bytes]) -> np.ndarray:
    """(n, 32) uint8: the digests as the batch entry stores them."""
    return np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(len(digests), 32)


class Pool:
    """A pool's batches: ``pools/<pool>/<batch key>`` markers, each batch an entry with ``digest_array`` (rows x 32
    bytes) beside its embeddings. Shared by the image pool here and the text pool (storage/text_pool.py)."""

    digest_array: ClassVar[str] = DIGEST_ARRAY

    def __init__(self, store: EmbeddingStore, pool: str):
        self.store = store
        self.pool = pool
        self.folder = store.root / "pools" / pool

    def batch_keys(self) -> list[str]:
        if not self.folder.exists():
            return []
        return sorted(p.name for p in self.folder.iterdir() if self.store.has(p.name))

    def register(self, batch_key: str) -> None:
        """List a batch in the pool: only once the batch is published, so a reader never sees a half-written one."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / batch_key).touch()

    def index(self) -> dict[bytes, tuple[str, int]]:
        """digest -> (batch key, row) of every input the pool holds (the first batch holding it)."""
        found: dict[bytes, tuple[str, int]] = {}
        for key in self.batch_keys():
            for row, sha in enumerate(self.store.open(key).array(self.digest_array)):
                found.setdefault(sha.tobytes(), (key, row))
        return found


    def gather_norms(self, where: list[tuple[str, int]]) -> np.ndarray | None:
        """Each row's L2 norm before normalisation at (batch key, row) positions, in that order (float32), or None
        when a batch keeps none (written before clipcache kept norms, or by a model that cannot give them): the raw
        vectors of ``where`` are then not all known."""
        keys = list(dict.fromkeys(key for key, _ in where))
        entries = {key: self.store.open(key) for key in keys}
        if not all(entry.has_norms for entry in entries.values()):
            return None
        parts = {key: entry.norms(f"pool {self.pool[:12]}") for key, entry in entries.items()}
        return np.array([parts[key][row] for key, row in where], dtype=np.float32).reshape(len(where))


    def gather_raw(self, where: list[tuple[str, int]]) -> tuple[np.ndarray | None, bool]:
        """The raw vectors (before normalisation) at (batch key, row) positions, in that order, and whether each is
        the model's output bit for bit (every batch keeps raw rows) rather than normalised row x norm (batches of
        earlier releases); None when a batch keeps no norms either."""
        keys = list(dict.fromkeys(key for key, _ in where))
        entries = {key: self.store.open(key) for key in keys}
        if not all(entry.has_raw or entry.has_norms for entry in entries.values()):
            return None, False
        parts = {key: entry.raw_embeddings(f"pool {self.pool[:12]}") for key, entry in entries.items()}
        exact = all(entry.has_raw for entry in entries.values())
        if not where:
            return np.empty((0, 0), dtype=np.float32), exact
        out = np.empty((len(where), parts[keys[0]].shape[1]), dtype=np.float32)
        for i, (key, row) in enumerate(where):
            out[i] = parts[key][row]
        return out, exact


class ContentPool(Pool):
    def gather(self, where: list[tuple[str, int]]) -> np.ndarray:
        """The vectors at (batch key, row) positions, in that order (each batch read once)."""
        keys = list(dict.fromkeys(key for key, _ in where))
        parts = {key: self.store.open(key).embeddings() for key in keys}
        if not where:
            return np.empty((0, 0), dtype=np.float32)
        out = np.empty((len(where), parts[keys[0]].shape[1]), dtype=np.float32)
        for i, (key, row) in enumerate(where):
            out[i] = parts[key][row]
        return out
