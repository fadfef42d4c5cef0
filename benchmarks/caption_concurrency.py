"""Captioning throughput: concurrency 16 vs one request at a time, against a server taking 200 ms per request.

    .venv/bin/python benchmarks/caption_concurrency.py [--images 200] [--delay 0.2] [--concurrency 16]

Both runs caption the same generated images through the real openai client and the local OpenAI-compatible server
(scripts/fake_vlm_server.py, 127.0.0.1), each with an empty caption cache. Target: >= 10x faster.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from fake_vlm_server import FakeVLMServer  # noqa: E402

from clipcache.storage.caption_cache import CaptionCache  # noqa: E402
from clipcache.tasks.convert.captioner import CaptionSettings, caption_images  # noqa: E402
from clipcache.tasks.datasets.shapes import load_shapes  # noqa: E402
from clipcache.tasks.progress import StageProgress  # noqa: E402


def run(api_base: str, images: list, concurrency: int) -> tuple[float, int]:
    settings = CaptionSettings("bench", api_base, "Describe this image", concurrency=concurrency, timeout=30)
    with tempfile.TemporaryDirectory() as cache_dir:
        cache = CaptionCache(cache_dir, {**settings.cache_setup(), "run": concurrency})
        start = time.perf_counter()
        result = caption_images(iter(images), len(images), settings, api_key="key", cache=cache,
                                progress=StageProgress(enabled=False), label="b")
        seconds = time.perf_counter() - start
    assert not result.failures and all(result.captions)
    return seconds, result.api_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    ds = load_shapes("bench", "zeroshot_retrieval", "test", None, size=args.images)
    images = [ds.load_image(i) for i in range(args.images)]
    with FakeVLMServer(delay=args.delay) as server:
        concurrent_s, calls = run(server.api_base, images, args.concurrency)
        sequential_s, _ = run(server.api_base, images, 1)
    print(f"{args.images} images, server {args.delay * 1000:.0f} ms per request, {calls} requests per run")
    print(f"one at a time  : {sequential_s:6.1f} s ({args.images / sequential_s:5.1f} images/s)")
    print(f"concurrency {args.concurrency:<3}: {concurrent_s:6.1f} s ({args.images / concurrent_s:5.1f} images/s)")
    print(f"ratio          : {sequential_s / concurrent_s:6.1f}x (target >= 10x)")


if __name__ == "__main__":
    main()
