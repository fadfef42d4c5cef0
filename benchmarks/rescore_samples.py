"""Issue #26's whole-command targets: a ``clipcache rescore`` of a 50,000-image, 1,000-class zero-shot classification
with per-sample rows and their bootstrap intervals takes at most 1.2x the same rescore without them, and the sample
rows take at most 3 MB of Parquet.

    .venv/bin/python benchmarks/rescore_samples.py                     # 50,000 images, ImageNet's 1,000 classes
    .venv/bin/python benchmarks/rescore_samples.py --images 5000 --repeats 2 --work /tmp/rescore-bench

The data is an ImageNet ``val/<wnid>/`` folder of small generated JPEGs (the reader, class names and 80 templates
are ImageNet's); the model is the bundled ``tiny-shapes-clip``. One cold ``eval`` fills the cache (not timed; kept
in ``--work`` for the next run). Then both sides run ``clipcache rescore`` in this process (the CLI's ``main``, local
orchestrator: cache reads, scoring, result files, warehouse rows), alternating, ``--repeats`` times each, best time
counted, each into a fresh output folder:

- **with**: the rescore as shipped (sample rows + 1,000-resample intervals);
- **without**: the same command with the zero-shot task's scorer told to keep no samples (``keep_samples=False``,
  no evidence): what a rescore cost before issue #26.

``import torch`` and the rest of the start-up are paid once by this process, before either side: the ratio is of
the work a rescore does, which is what the rows add to.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from clipcache.flows.cli import main
from clipcache.tasks.datasets.clip_benchmark.original import imagenet_wnids


def write_folder(root: Path, n: int) -> None:
    if (root / "done").exists():
        return
    rng = np.random.default_rng(0)
    wnids = imagenet_wnids()
    for i in range(n):
        folder = root / "val" / wnids[i % len(wnids)]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (rng.random((8, 8, 3)) * 255).astype(np.uint8)
        Image.fromarray(pixels).resize((48, 48)).save(folder / f"ILSVRC2012_val_{i:08d}.JPEG", quality=85)
    (root / "done").write_text(str(n))


def argv(command: str, root: Path, work: Path, out: Path) -> list[str]:
    return [command, "--model", "tiny-shapes-clip", "--dataset", "imagenet1k", "--dataset_root", str(root),
            "--batch_size", "256", "--orchestrator", "local", "--quiet", "--cache_dir", str(work / "cache"),
            "--output_dir", str(out)]


def without_samples() -> Any:
    """The zero-shot scorer as it was before per-sample rows: metrics only."""
    from clipcache.tasks.evaluation.base import Scored
    from clipcache.tasks.evaluation.zeroshot_classification import ZeroShotClassification
    from clipcache.tasks.score.stage import score_classification

    def score(self: Any, store: Any, encoded: Any, prepared: Any, settings: Any) -> Scored:
        started = time.perf_counter()
        metrics, n, _ = score_classification(store, encoded.outcomes["image"].ref, encoded.outcomes["prompt"],
                                             n_classes=encoded.info["n_classes"],
                                             n_templates=encoded.info["n_templates"], settings=settings,
                                             n_samples=prepared.n_samples, keep_samples=False)
        return Scored(metrics, n, seconds=time.perf_counter() - started, evidence=None)

    shipped = ZeroShotClassification.score
    return ZeroShotClassification, shipped, score


def parquet_bytes(out: Path, part: str) -> int:
    return sum(p.stat().st_size for p in (out / "warehouse").rglob("*.parquet") if part in p.parts)


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "clipcache-rescore-bench")
    args = parser.parse_args()
    root = args.work / f"imagenet-{args.images}"
    started = time.perf_counter()
    write_folder(root, args.images)
    print(f"data: {args.images:,} JPEGs in {root} ({time.perf_counter() - started:.1f} s)")
    started = time.perf_counter()
    assert main(argv("eval", root, args.work, args.work / "cold")) == 0
    print(f"cold eval (fills the cache, once): {time.perf_counter() - started:.1f} s")

    task, shipped, bare = without_samples()
    best = {"with": float("inf"), "without": float("inf")}
    sizes: dict[str, int] = {}
    for r in range(args.repeats):
        for side in ("without", "with"):
            out = args.work / f"{side}-{r}"
            shutil.rmtree(out, ignore_errors=True)
            task.score = bare if side == "without" else shipped  # type: ignore[method-assign]
            started = time.perf_counter()
            assert main(argv("rescore", root, args.work, out)) == 0
            best[side] = min(best[side], time.perf_counter() - started)
            sizes[side] = parquet_bytes(out, "samples")
    task.score = shipped  # type: ignore[method-assign]
    ratio = best["with"] / best["without"]
    print(f"rescore without sample rows: {best['without']:.2f} s (best of {args.repeats})")
    print(f"rescore with sample rows + intervals: {best['with']:.2f} s   ratio {ratio:.2f}x (target <= 1.2x)")
    print(f"sample rows: {sizes['with'] / 1e6:.2f} MB of Parquet for {args.images:,} images (target <= 3 MB); "
          f"without: {sizes['without'] / 1e6:.2f} MB")


if __name__ == "__main__":
    main_()
