"""Retrieval scoring from the cache, both directions, recall@1/5/10, against one matrix-product pass over the same
data and against FAISS's exact flat inner-product index (top-10 both ways), measured in the same run.

    .venv/bin/python benchmarks/retrieval_scoring.py                       # 5,000 images x 25,000 captions, CPU
    .venv/bin/python benchmarks/retrieval_scoring.py --images 20000 --captions 100000
    .venv/bin/python benchmarks/retrieval_scoring.py --images 100000 --captions 500000 --no-reference  # memory, once
    .venv/bin/python benchmarks/retrieval_scoring.py --device cuda

Random unit vectors (captions near their image, so ranks are realistic) are written into real cache entries; the
score stage (tasks/score/stage.py: reading and checking the entries, both directions) runs in a fresh process that
reports its time and peak memory. The reference is one float32 product captions x images.T in 256 MB tiles
(results discarded), with NumPy and with torch: the faster counts. FAISS (pip install faiss-cpu; optional) searches
top-10 images per caption and top-10 captions per image. Ratios are time / reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TILE_BYTES = 256 * 1024 * 1024


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def data(n_images: int, n_captions: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    owner = np.sort(np.concatenate([np.arange(n_images), rng.integers(0, n_images, n_captions - n_images)]))
    images = unit(rng, n_images, dim)
    captions = images[owner] + 5.0 * unit(rng, n_captions, dim)
    captions /= np.linalg.norm(captions, axis=1, keepdims=True)
    return images, captions, owner


def build(cache: Path, n_images: int, n_captions: int, dim: int) -> tuple[str, str]:
    """Real cache entries, laid out as the encode stage writes them (captions: distinct rows + maps)."""
    from clipcache.storage.embedding_store import EmbeddingStore

    images, captions, owner = data(n_images, n_captions, dim)
    store = EmbeddingStore(cache)
    keys = []
    for kind, rows, extra in (("image", images, None),
                              ("caption", captions, {"caption_row": np.arange(n_captions), "caption_sample": owner})):
        with store.writer({"bench": kind, "n": len(rows)}, kind, capacity=len(rows)) as w:
            for lo in range(0, len(rows), 8192):
                w.add(rows[lo:lo + 8192], np.arange(lo, min(lo + 8192, len(rows))))
            keys.append(w.finish(meta={"n_samples": n_images} if kind == "image" else {}, extra_arrays=extra).key)
    return keys[0], keys[1]


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    """Start the peak (VmHWM) afresh. getrusage's ru_maxrss is no good in a child: Linux carries the peak of the
    parent's memory, copied at fork, across exec, so the child would report the parent's peak (here: the data it
    generated)."""
    Path("/proc/self/clear_refs").write_text("5")


def score_child(cache: str, image_key: str, caption_key: str, device: str, repeats: str) -> None:
    import torch

    from clipcache.storage.cache_keys import EmbeddingRef
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.evaluation.base import ScoreSettings
    from clipcache.tasks.score.stage import score_retrieval

    store = EmbeddingStore(cache)
    images, captions = store.open(image_key), store.open(caption_key)
    refs = (EmbeddingRef(cache, image_key, "image", images.count, images.dim),
            EmbeddingRef(cache, caption_key, "caption", captions.count, captions.dim))
    settings = ScoreSettings(recall_k=(1, 5, 10), device=device)
    # libraries initialised (BLAS thread buffers, torch's kernels) on tiny inputs, nothing of the data read yet:
    # the peak above this is what scoring the data costs
    small = np.ones((64, 64), dtype=np.float32)
    torch.topk(torch.from_numpy(small @ small) @ torch.from_numpy(small), 5, dim=0)
    reset_peak()
    before = rss_mb()
    once = repeats == "1"  # a memory run at a size where every pass takes minutes: no warm-up, no second pass
    if not once:
        score_retrieval(store, *refs, ScoreSettings(recall_k=(1,), device=device), ties="topk")  # warm-up: kernels
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    best = float("inf")
    for _ in range(int(repeats)):
        start = time.perf_counter()
        metrics, _, tied, _ = score_retrieval(store, *refs, settings, ties="topk")
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    peak = rss_mb("VmHWM")
    gpu = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
    if once:
        print(json.dumps({"seconds": best, "pass_seconds": None, "peak_rss_mb": peak, "rss_before_mb": before,
                          "gpu_peak_mb": gpu, "metrics": metrics, "tied": tied, "decided_exactly": None}))
        return
    # the pass alone, on embeddings already on the device (what the stage adds: reading and checking the cache)
    from clipcache.tasks.score.device import load_rows, tile_bytes
    from clipcache.tasks.score.retrieval_pass import recall_counts
    from clipcache.tasks.score.stage import caption_targets

    caption_row, owner, _ = caption_targets(store, *refs)
    d = torch.device(device)
    image_rows, caption_rows = load_rows(images, d), load_rows(captions, d, caption_row)
    host = (caption_rows.cpu(), image_rows.cpu()) if d.type == "cuda" else None
    owner_t = torch.from_numpy(owner).to(d)
    pass_best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        t2i, i2t = recall_counts(caption_rows, image_rows, owner_t, [1, 5, 10], tile_bytes(d), rule="topk",
                                 topk_device=d, host=host)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        pass_best = min(pass_best, time.perf_counter() - start)
    print(json.dumps({"seconds": best, "pass_seconds": pass_best, "peak_rss_mb": peak, "rss_before_mb": before,
                      "gpu_peak_mb": gpu, "metrics": metrics, "tied": tied,
                      "decided_exactly": t2i.decided_exactly + i2t.decided_exactly}))


def reference_product(images: np.ndarray, captions: np.ndarray, device: str) -> dict[str, float]:
    """One float32 product captions @ images.T in tiles: NumPy and torch, best of 3 each."""
    import torch

    rows = max(1, TILE_BYTES // (4 * len(images)))
    out: dict[str, float] = {}
    if device == "cpu":
        images_t = np.ascontiguousarray(images.T)
        out["numpy"] = min(_timed(lambda: [captions[lo:lo + rows] @ images_t for lo in range(0, len(captions), rows)])
                           for _ in range(3))
    c, i = torch.from_numpy(captions).to(device), torch.from_numpy(images).to(device).T.contiguous()

    def torch_pass() -> None:
        for lo in range(0, len(c), rows):
            c[lo:lo + rows] @ i
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    torch_pass()
    out["torch"] = min(_timed(torch_pass) for _ in range(3))
    return out


def faiss_both_ways(images: np.ndarray, captions: np.ndarray, k: int = 10) -> float | None:
    try:
        import faiss
    except ImportError:
        return None

    def run() -> None:
        index = faiss.IndexFlatIP(images.shape[1])
        index.add(images)
        index.search(captions, k)
        index = faiss.IndexFlatIP(images.shape[1])
        index.add(captions)
        index.search(images, k)

    return min(_timed(run) for _ in range(2))


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--captions", type=int, default=25000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-reference", action="store_true", help="skip the product and FAISS (memory runs)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        score_child(*args.child)
        return
    import torch

    print(f"{args.images:,} images x {args.captions:,} captions x {args.dim}-d, device {args.device}, "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        image_key, caption_key = build(cache, args.images, args.captions, args.dim)
        child = subprocess.run([sys.executable, __file__, "--child", str(cache), image_key, caption_key,
                                args.device, "1" if args.no_reference else "3"], capture_output=True, text=True,
                               check=True)
        result = json.loads(child.stdout.strip().splitlines()[-1])
    data_mb = (args.images + args.captions) * args.dim * 4 / 2**20
    extra = result["peak_rss_mb"] - result["rss_before_mb"]
    print(f"clipcache score stage (from the cache, both directions, recall@1/5/10): {result['seconds']:.3f} s; "
          f"peak RSS {result['peak_rss_mb']:.0f} MB, {extra:.0f} MB above the process before scoring "
          f"(embeddings: {data_mb:.0f} MB)" + (f"; GPU peak {result['gpu_peak_mb']:.0f} MB"
                                              if result["gpu_peak_mb"] else ""))
    print(f"  recall@5 t2i {result['metrics']['image_retrieval_recall@5']:.4f}, "
          f"i2t {result['metrics']['text_retrieval_recall@5']:.4f}; tie-sensitive {sum(result['tied'].values())}")
    if args.no_reference:  # one run, no warm-up: time and memory only
        return
    print(f"  the pass alone (embeddings already on the device): {result['pass_seconds']:.3f} s; queries decided "
          f"exactly {result['decided_exactly']}")
    images, captions, _ = data(args.images, args.captions, args.dim)
    product = reference_product(images, captions, args.device)
    best = min(product.values())
    print("one float32 product captions x images.T: " + ", ".join(f"{k} {v:.3f} s" for k, v in product.items()))
    print(f"clipcache / one product pass: {result['seconds'] / best:.2f}x (the pass alone: "
          f"{result['pass_seconds'] / best:.2f}x)")
    if args.device == "cpu":
        seconds = faiss_both_ways(images, captions)
        if seconds is None:
            print("FAISS: not installed (pip install faiss-cpu)")
        else:
            print(f"FAISS IndexFlatIP top-10 both ways: {seconds:.3f} s = {seconds / best:.2f}x one pass; "
                  f"clipcache is {seconds / result['seconds']:.2f}x faster")


if __name__ == "__main__":
    main()
