"""Retrieval scoring at scale from the cache: 20,000 images x 100,000 captions, 512-d float32.

    .venv/bin/python benchmarks/retrieval_scoring.py [--images 20000] [--captions 100000] [--dim 512]

Writes random unit vectors into real cache entries, then runs the score stage (both directions, recall@1/5/10) in a
fresh process and reports seconds and that process's peak RSS (target < 3 GB). For scale: clip_benchmark's dense
texts x images float32 matrix alone would take captions * images * 4 bytes (8 GB here), plus its boolean mask.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clipcache.storage.embedding_store import AuxSpec, EmbeddingStore  # noqa: E402


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def build(cache: Path, n_images: int, n_captions: int, dim: int) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    store = EmbeddingStore(cache)
    caption_image = np.sort(np.concatenate([np.arange(n_images), rng.integers(0, n_images, n_captions - n_images)]))
    images = unit(rng, n_images, dim)
    # Captions near their image, so recall is far from chance and ranks are realistic.
    captions = images[caption_image] + 5.0 * unit(rng, n_captions, dim)
    captions /= np.linalg.norm(captions, axis=1, keepdims=True)
    keys = []
    for kind, data, aux in (("image", images, {}), ("caption", captions, {"sample_index": caption_image})):
        spec = {name: AuxSpec(str(v.dtype)) for name, v in aux.items()}
        with store.writer({"bench": kind, "n": len(data)}, kind, capacity=len(data), aux=spec) as w:
            for lo in range(0, len(data), 8192):
                w.add(data[lo:lo + 8192], np.arange(lo, min(lo + 8192, len(data))),
                      **{k: v[lo:lo + 8192] for k, v in aux.items()})
            keys.append(w.finish().key)
    return keys[0], keys[1]


def score_child(cache: str, image_key: str, caption_key: str) -> None:
    from clipcache.storage.embedding_store import EmbeddingRef
    from clipcache.tasks.score.stage import score_retrieval

    store = EmbeddingStore(cache)
    images, captions = store.open(image_key), store.open(caption_key)
    start = time.perf_counter()
    metrics, n = score_retrieval(store, EmbeddingRef(cache, image_key, "image", images.count, images.dim),
                                 EmbeddingRef(cache, caption_key, "caption", captions.count, captions.dim), [1, 5, 10])
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_mb, "metrics": metrics}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--captions", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        score_child(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        image_key, caption_key = build(Path(tmp), args.images, args.captions, args.dim)
        proc = subprocess.run([sys.executable, __file__, "--child", tmp, image_key, caption_key],
                              capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    dense_gb = args.images * args.captions * 4 / 1e9
    print(f"{args.images:,} images x {args.captions:,} captions x {args.dim}-d float32, both directions, k=1,5,10")
    print(f"scoring time : {result['seconds']:.1f} s")
    print(f"peak RSS     : {result['peak_rss_mb'] / 1024:.2f} GB (target < 3 GB; a dense score matrix alone: "
          f"{dense_gb:.1f} GB)")
    print("metrics      : " + ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()))


if __name__ == "__main__":
    main()
