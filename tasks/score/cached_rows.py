"""The rows of a cache entry a scorer reads, checked against the data it is scored with: each image's row (an image
skipped as undecodable has none) and each text's vector."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from clipcache.storage.errors import CacheIntegrityError

if TYPE_CHECKING:
    from clipcache.storage.cache_entry import EmbeddingEntry


def _misfit(entry: EmbeddingEntry, what: str) -> CacheIntegrityError:
    return CacheIntegrityError(f"cache entry {entry.key} does not fit this evaluation: {what} ({entry.path}); delete "
                               f"it with `{entry.remedy('rm')}` and run the evaluation again")


def image_rows(entry: EmbeddingEntry, n_images: int) -> np.ndarray:
    """Each of the ``n_images`` images' row in ``entry``, -1 for an image skipped as undecodable."""
    stored = int(entry.meta.get("n_samples", entry.count))
    if stored != n_images or entry.count > n_images:
        raise _misfit(entry, f"it holds {entry.count} rows of {stored} images, the data has {n_images}")
    rows = np.full(n_images, -1, dtype=np.int64)
    rows[entry.array("position")] = np.arange(entry.count)
    return rows


def text_vectors(entry: EmbeddingEntry, n_texts: int) -> np.ndarray:
    """The vectors of an entry of ``n_texts`` texts, in their order."""
    if entry.count != n_texts:
        raise _misfit(entry, f"it holds {entry.count} texts, the data has {n_texts}")
    return entry.embeddings()
