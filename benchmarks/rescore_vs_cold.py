"""Re-scoring from the cache vs a cold evaluation, side by side in one run.

    .venv/bin/python benchmarks/rescore_vs_cold.py [--images 2000] [--captions_per_image 5] [--model ViT-B-32]

A retrieval dataset of generated shapes images with 5 captions each (2,000 images / 10,000 captions by default) in
the webdataset layout; a ViT-B-32-sized open_clip model with random (seeded) weights. The cold run encodes every
image and caption and scores; the re-score reads the cache and scores with other k values. Target: >= 50x faster.
Takes several minutes on a 2-core CPU (the cold encode is the slow part, which is the point).
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402
from clipcache.storage.hashing import FileHashMemo  # noqa: E402
from clipcache.tasks.datasets.shapes import caption, load_shapes  # noqa: E402
from clipcache.tasks.encode.stage import ModelSession  # noqa: E402
from clipcache.tasks.evaluation import evaluate_one  # noqa: E402
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, ScoreSettings  # noqa: E402
from clipcache.tasks.models.resolve import resolve_model  # noqa: E402
from clipcache.tasks.models.spec import ModelSpec  # noqa: E402
from clipcache.tasks.progress import StageProgress  # noqa: E402


def write_retrieval_wds(root: Path, n: int, per_image: int) -> None:
    ds = load_shapes("bench", "zeroshot_classification", "test", None, size=n)
    (root / "test").mkdir(parents=True)
    with tarfile.open(root / "test" / "0.tar", "w") as tar:
        for i in range(n):
            buf = io.BytesIO()
            ds.load_image(i).save(buf, format="PNG")
            text = "\n".join(caption(ds.samples[i], j) for j in range(per_image)).encode()
            for name, data in ((f"{i:06d}.png", buf.getvalue()), (f"{i:06d}.txt", text)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (root / "test" / "nshards.txt").write_text("1")
    (root / "dataset_type.txt").write_text("retrieval")


def run(root: Path, cache: Path, recall_k: list[int], model: str, cached_only: bool) -> tuple[float, dict, int]:
    memo = FileHashMemo(None)
    start = time.perf_counter()
    session = ModelSession(resolve_model(ModelSpec(model_name=model), memo), torch.device("cpu"), False, "fp32")
    scored = evaluate_one("zeroshot_retrieval", session, DataSource("wds/bench", str(root)), EmbeddingStore(cache),
                          memo, encode=EncodeSettings(64, 2, cached_only=cached_only),
                          score=ScoreSettings(tuple(recall_k)),
                          progress=StageProgress(enabled=not cached_only))
    return time.perf_counter() - start, scored.metrics, session.loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--captions_per_image", type=int, default=5)
    parser.add_argument("--model", default="ViT-B-32")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, cache = Path(tmp) / "wds", Path(tmp) / "cache"
        write_retrieval_wds(root, args.images, args.captions_per_image)
        cold_s, cold, cold_loads = run(root, cache, [1, 5, 10], args.model, cached_only=False)
        warm_s, warm, warm_loads = run(root, cache, [1, 2, 5, 10, 20], args.model, cached_only=True)
    assert warm_loads == 0 and all(warm[k] == v for k, v in cold.items())
    n_captions = args.images * args.captions_per_image
    print(f"{args.model} (random weights), {args.images:,} images / {n_captions:,} captions, fp32, CPU")
    print(f"cold evaluation : {cold_s:8.1f} s (loads the model, decodes and encodes everything, scores)")
    print(f"re-score        : {warm_s:8.2f} s (model loads: {warm_loads}; reads the cache, scores 5 k values)")
    print(f"ratio           : {cold_s / warm_s:8.0f}x faster (target >= 50x)")


if __name__ == "__main__":
    main()
