"""Cached embeddings onto the scoring device, block by block, and the tile sizes a memory budget allows.

Blocks are read from Zarr, checked against their seals and for finite values, and copied straight into a
preallocated tensor on the device: the host holds one block at a time, never a second copy of the matrix.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from clipcache.storage.cache_entry import EmbeddingEntry
from clipcache.storage.errors import CacheIntegrityError

READ_BLOCK_ROWS = 16_384
# Score tiles of queries x candidates: at most this many bytes at once (CLIPCACHE_SCORE_BUDGET_MB overrides).
CPU_TILE_BYTES = 160 * 1024 * 1024  # measured: 256 MB is no faster here and costs ~100 MB more (README)
GPU_TILE_FRACTION = 0.25  # of the device memory free when scoring starts


def torch_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        from clipcache.storage.errors import ConfigError

        raise ConfigError(f"device: {name!r} requested but CUDA is not available on this machine")
    return device


def tile_bytes(device: torch.device) -> int:
    if override := os.environ.get("CLIPCACHE_SCORE_BUDGET_MB"):
        return int(float(override) * 1024 * 1024)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * GPU_TILE_FRACTION)
    return CPU_TILE_BYTES


def check_finite(values: torch.Tensor, entry: EmbeddingEntry, rows: torch.Tensor | None = None) -> None:
    """One clear line for a NaN or infinite embedding (``rows``: the entry rows ``values`` came from)."""
    # the sum of unit vectors' entries is finite exactly when every entry is (one reduction, no boolean copy)
    if bool(torch.isfinite(values.sum())):
        return
    finite = torch.isfinite(values).all(dim=1)
    if not bool(finite.all()):
        bad = int(torch.nonzero(~finite)[0])
        row = int(rows[bad]) if rows is not None else bad
        raise CacheIntegrityError(f"cache entry {entry.key} holds a non-finite embedding (row {row}, {entry.path}); "
                                  f"delete it with `{entry.remedy()}` and run the "
                                  f"evaluation again")


def load_rows(entry: EmbeddingEntry, device: torch.device, take: np.ndarray | None = None,
              host: torch.Tensor | None = None) -> torch.Tensor:
    """The embeddings on ``device`` (float32), read and checked block by block; with ``take``, the rows
    ``entry[take]`` in that order (rows repeat freely), gathered as the blocks go by, so the host never holds the
    whole array and the device never holds it twice. ``host``: a tensor on the CPU of the same shape to fill too
    (the score stage keeps one when it scores on a GPU, for the rows it recomputes as clip_benchmark does)."""
    n = entry.count if take is None else len(take)
    out = torch.empty((n, entry.dim), dtype=torch.float32, device=device)
    if take is not None:
        order = np.argsort(take, kind="stable")
        sorted_rows = take[order]
    for lo, block in entry.blocks("embeddings", READ_BLOCK_ROWS):
        piece = torch.from_numpy(np.ascontiguousarray(block)).to(device)
        if take is None:
            check_finite(piece, entry, torch.arange(lo, lo + len(block)))
            out[lo : lo + len(block)] = piece
            if host is not None:
                host[lo : lo + len(block)] = torch.from_numpy(block)
            continue
        a, b = np.searchsorted(sorted_rows, [lo, lo + len(block)])
        if a == b:
            continue
        wanted = torch.from_numpy(sorted_rows[a:b] - lo)
        check_finite(piece[wanted.to(device)], entry, wanted + lo)
        out[torch.from_numpy(order[a:b]).to(device)] = piece[wanted.to(device)]
        if host is not None:
            host[torch.from_numpy(order[a:b])] = torch.from_numpy(block)[wanted]
    return out
