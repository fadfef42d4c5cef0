"""Cached embedding read throughput (float32), with and without chunk checksum verification.

    .venv/bin/python benchmarks/cache_read.py [--rows 200000] [--dim 512]

Writes one entry through the real writer, then reads it back the way the score stage does. Store layout: 4,096-row
chunks, uncompressed (embeddings barely compress: zstd saves ~9% at half the speed), so reads run at disk/page-cache
speed; verification adds one SHA-256 pass. Target: >= 500 MB/s. Also prints the write rate.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402


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
        timings = {True: [], False: []}
        for _ in range(args.repeats):
            for verify in (False, True):
                start = time.perf_counter()
                got = store.open(key).embeddings(verify=verify)
                timings[verify].append(time.perf_counter() - start)
        assert np.array_equal(got, data)
    raw, checked = min(timings[False]), min(timings[True])
    print(f"{args.rows:,} x {args.dim} float32 = {mb:,.0f} MB, 4,096-row chunks, uncompressed")
    print(f"write                 : {mb / write_s:8,.0f} MB/s")
    print(f"read                  : {mb / raw:8,.0f} MB/s (best of {args.repeats})")
    print(f"read + verify SHA-256 : {mb / checked:8,.0f} MB/s (target >= 500 MB/s; what the score stage does)")


if __name__ == "__main__":
    main()
