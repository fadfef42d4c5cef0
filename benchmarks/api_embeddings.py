"""API embedding throughput: images and texts through an embeddings API one request at a time vs 16 in flight.

    .venv/bin/python benchmarks/api_embeddings.py [--images 2000] [--texts 4000] [--delay 0.1] [--concurrency 16]
        [--only images|texts]

The server is scripts/fake_embedding_server.py in its own process on 127.0.0.1, serving tiny-shapes-clip with
``--delay`` seconds of added latency per request (a hosted API's round trip). The client is clipcache's normal encode
stage (decoding threads, PNG data URLs, the Zarr cache writer) with an ``api:tiny-shapes-clip`` model, one request
per image, each run into an empty cache; texts (distinct captions) go one request per ``--batch_size`` texts,
``--api_concurrency`` requests in flight. The canary check at model load is timed apart. Prints images/s and texts/s
for each concurrency and their ratios.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402
from clipcache.storage.hashing import FileHashMemo  # noqa: E402
from clipcache.tasks.datasets.shapes import load_shapes  # noqa: E402
from clipcache.tasks.encode.stage import ModelSession, encode_images, encode_texts, image_key_fields  # noqa: E402
from clipcache.tasks.evaluation.base import EncodeSettings  # noqa: E402
from clipcache.tasks.models.resolve import resolve_model  # noqa: E402
from clipcache.tasks.models.spec import ModelSpec  # noqa: E402
from clipcache.tasks.progress import StageProgress  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(delay: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "fake_embedding_server.py"), "--port",
                               str(port), "--delay", str(delay)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    line = server.stdout.readline()  # printed once the model is loaded and the socket bound
    if "serving" not in line:
        server.kill()
        raise SystemExit(f"the embedding server did not start: {line!r}")
    return server, f"http://127.0.0.1:{port}/v1"


def run(api_base: str, dataset, concurrency: int, batch_size: int, num_workers: int,
        texts: list[str] | None = None) -> tuple[float, float, int]:
    """(seconds to load the model (canaries), seconds to encode the images, or ``texts``, requests sent)."""
    with tempfile.TemporaryDirectory() as cache:
        spec = ModelSpec(model_name="api:tiny-shapes-clip", api_base=api_base, api_concurrency=concurrency,
                         api_revision="bench")
        session = ModelSession(resolve_model(spec, FileHashMemo(Path(cache) / "file_hashes.json")),
                               torch.device("cpu"), False, "fp32")
        started = time.perf_counter()
        model = session.model
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        if texts is None:
            fields = image_key_fields(session, {"bench": len(dataset)}, "test", None)
            outcome = encode_images(session, dataset, EmbeddingStore(cache), fields,
                                    EncodeSettings(batch_size=batch_size, num_workers=num_workers),
                                    StageProgress(enabled=False))
        else:
            outcome = encode_texts(session, texts, EmbeddingStore(cache), {"bench": "texts", "n": len(texts)},
                                   kind="caption", batch_size=batch_size, progress=StageProgress(enabled=False),
                                   label="bench")
        seconds = time.perf_counter() - started
        assert outcome.encoded == (len(dataset) if texts is None else len(texts))
        requests = model.client.usage.requests  # type: ignore[attr-defined]
        session.close(report=False)
    return loaded, seconds, requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--only", choices=["images", "texts"])
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "bench")
    dataset = load_shapes("bench", "zeroshot_classification", "test", None, size=args.images)
    captions = [f"caption {i}: a {('small', 'large')[i % 2]} shape number {i // 2}" for i in range(args.texts)]
    server, api_base = start_server(args.delay)
    rows: dict[tuple[str, int], tuple[float, float, int]] = {}
    try:
        for what in [args.only] if args.only else ["images", "texts"]:
            for c in (1, args.concurrency):
                rows[what, c] = run(api_base, dataset, c, args.batch_size, args.num_workers,
                                    captions if what == "texts" else None)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"{args.images} images / {args.texts} texts, server latency {args.delay * 1000:.0f} ms per request, "
          f"batch_size {args.batch_size}, {os.cpu_count()} CPU cores (server and client share them)")
    for (what, c), (loaded, seconds, requests) in rows.items():
        n = args.images if what == "images" else args.texts
        print(f"{what:6s} concurrency {c:<3}: {seconds:7.1f} s  {n / seconds:7.1f} {what}/s  ({requests} requests, "
              f"canary check at load {loaded:.2f} s)")
        if c == args.concurrency:
            print(f"{what:6s} ratio          : {rows[what, 1][1] / seconds:6.1f}x")


if __name__ == "__main__":
    main()
