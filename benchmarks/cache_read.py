"""Cached embedding read throughput (float32): no verification, the CRC32C block seals the cache uses, the SHA-256
seals of earlier releases, and Zarr's own CRC32C chunk codec, measured in the same run.

    .venv/bin/python benchmarks/cache_read.py [--rows 200000] [--dim 512]

Writes one entry through the real writer, then reads it back the way the score stage does. Store layout: 4,096-row
chunks, uncompressed (embeddings barely compress: zstd saves ~9% at half the speed), so reads run at disk/page-cache
speed; verification adds one checksum pass per block. Target: >= 500 MB/s. Also prints the write rate. Zarr's codec
checks each chunk as it decodes, but only the chunk files: the block seals also cover rows that a rewrite moved and
are recorded per array in the entry's sealed metadata, so the seals stay; the figures say what each costs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clipcache.storage.cache_entry import seal_attrs  # noqa: E402
from clipcache.storage.cache_keys import block_digest  # noqa: E402
from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402


def with_sha256_seals(store: EmbeddingStore, key: str) -> None:
    """Re-seal an entry as releases before CRC32C did (SHA-256 hex under ``chunk_sha256``)."""
    group = zarr.open_group(str(store.entry_path(key)), mode="r+")
    attrs = dict(group.attrs)
    rows = attrs["chunk_rows"]
    seals = {name: [block_digest(np.asarray(group[name][lo:lo + rows]), "sha256")
                    for lo in range(0, group[name].shape[0], rows)] for name in attrs["chunk_seals"]}
    attrs.pop("chunk_seals")
    group.attrs.clear()
    group.attrs.update(seal_attrs({**attrs, "chunk_sha256": seals}))


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = np.random.default_rng(0).standard_normal((args.rows, args.dim), dtype=np.float32)
    mb = data.nbytes / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        store = EmbeddingStore(tmp)
        start = time.perf_counter()
        with store.writer({"bench": "read"}, "image", capacity=args.rows) as w:
            for lo in range(0, args.rows, 8192):
                w.add(data[lo:lo + 8192], np.arange(lo, min(lo + 8192, args.rows)))
            key = w.finish().key
        write_s = time.perf_counter() - start
        raw = best(lambda: store.open(key).embeddings(verify=False), args.repeats)
        crc = best(lambda: store.open(key).embeddings(verify=True), args.repeats)
        assert np.array_equal(store.open(key).embeddings(), data)
        sealed_sha = EmbeddingStore(Path(tmp) / "sha")
        with sealed_sha.writer({"bench": "read"}, "image", capacity=args.rows) as w:
            for lo in range(0, args.rows, 8192):
                w.add(data[lo:lo + 8192], np.arange(lo, min(lo + 8192, args.rows)))
            sha_key = w.finish().key
        with_sha256_seals(sealed_sha, sha_key)
        sha = best(lambda: sealed_sha.open(sha_key).embeddings(verify=True), args.repeats)
        codec = zarr.create_array(str(Path(tmp) / "codec.zarr"), shape=data.shape, chunks=(4096, args.dim),
                                  dtype="float32", compressors=[zarr.codecs.Crc32cCodec()])
        codec[...] = data
        zarr_crc = best(lambda: np.asarray(zarr.open_array(str(Path(tmp) / "codec.zarr"), mode="r")[...]),
                        args.repeats)
    print(f"{args.rows:,} x {args.dim} float32 = {mb:,.0f} MB, 4,096-row chunks, uncompressed, best of {args.repeats}")
    print(f"write                        : {mb / write_s:8,.0f} MB/s")
    print(f"read, not verified           : {mb / raw:8,.0f} MB/s")
    print(f"read + CRC32C block seals    : {mb / crc:8,.0f} MB/s (what the score stage does; target >= 500 MB/s)")
    print(f"read + SHA-256 block seals   : {mb / sha:8,.0f} MB/s (entries of earlier releases)")
    print(f"read, Zarr Crc32cCodec chunks: {mb / zarr_crc:8,.0f} MB/s (Zarr's own checksum codec)")
    print(f"CRC32C seals vs SHA-256 seals: {sha / crc:.2f}x faster")


if __name__ == "__main__":
    main()
