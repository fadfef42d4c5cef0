"""What per-sample rows and bootstrap intervals cost next to the scoring they come from (issue #26's targets:
classification with sample rows <= 1.2x without, <= 3 MB of Parquet per 50,000 samples, intervals < 1 s).

    .venv/bin/python benchmarks/sample_rows.py                              # both parts, defaults below
    .venv/bin/python benchmarks/sample_rows.py --images 50000 --classes 1000 --captions-per-image 5 \\
        --retrieval-images 5000 --dim 512 --repeats 3

(a) Zero-shot classification, 50,000 images x 1,000 classes, synthetic L2-normalised embeddings: the score stage's
own loop (tasks/score/stage.py: logits per batch of 64 as clip_benchmark makes them, ``ClassificationCounts``),
without samples, and with samples + the intervals (``classification_evidence``, 1,000 resamples).
(b) Zero-shot retrieval, 5,000 images x 25,000 captions (5 per image), 512-d: the recall pass alone
(``recall_counts``), and the same pass keeping every query's outcome (``query_outcomes``) + the evidence of both
directions (rows and recall@1/5/10 intervals). Embeddings are already in memory (no cache read): the ratios are
the strictest ones, the cache read would add the same time to both sides.

Each side runs ``--repeats`` times, alternating, and the best time counts. The rows are written with
storage/results.py ``write_sample_rows`` into a temporary folder to measure their Parquet size.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from retrieval_sets import retrieval_set

from clipcache.storage.results import write_sample_rows
from clipcache.tasks.score.classification import ClassificationCounts, logit_batches, zero_shot_classifier
from clipcache.tasks.score.device import tile_bytes
from clipcache.tasks.score.evidence import classification_evidence
from clipcache.tasks.score.retrieval_evidence import RetrievalQueries, zeroshot_retrieval_evidence
from clipcache.tasks.score.retrieval_pass import query_outcomes, recall_counts

RESAMPLES = 1000
BATCH = 64  # the score stage's logit blocks (clip_benchmark's data-loader batches)


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


class Timing:
    """Best wall time and best CPU time (this process, all threads) of one side over the repeats. On a shared
    machine the wall time swings with the neighbours' load; the CPU time much less (with --threads 1 it is the
    work done)."""

    def __init__(self) -> None:
        self.wall = self.cpu = float("inf")

    def __str__(self) -> str:
        return f"{self.wall:.3f} s (CPU {self.cpu:.3f} s)"

    def ratio(self, base: Timing) -> str:
        return f"{self.wall / base.wall:.2f}x (CPU {self.cpu / base.cpu:.2f}x)"


def best_of(repeats: int, *sides: Callable[[], Any]) -> list[Timing]:
    """Each side's best times, the sides alternating (a noisy machine slows both alike)."""
    best = [Timing() for _ in sides]
    for _ in range(repeats):
        for timing, side in zip(best, sides, strict=True):
            wall, cpu = time.perf_counter(), time.process_time()
            side()
            timing.wall = min(timing.wall, time.perf_counter() - wall)
            timing.cpu = min(timing.cpu, time.process_time() - cpu)
    return best


def parquet_bytes(evidence: Any, task: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        paths = [write_sample_rows(tmp, "bench", created_at=datetime.now(UTC), experiment_id="e", task=task,
                                   unit=part.unit, columns=part.columns, keys=part.keys) for part in evidence.parts()]
        return sum(Path(p).stat().st_size for p in paths)


def classification(n_images: int, n_classes: int, dim: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    targets = torch.from_numpy(rng.integers(0, n_classes, n_images))
    prompts = unit(rng, n_classes, dim)
    classifier = zero_shot_classifier(prompts, n_classes, 1)
    # images near their class's prompt, so accuracy is realistic (neither 0 nor 1)
    images = prompts[targets.numpy()] + 0.08 * unit(rng, n_images, dim) * np.sqrt(dim)
    images = torch.from_numpy((images / np.linalg.norm(images, axis=1, keepdims=True)).astype(np.float32))

    def score(keep: bool) -> ClassificationCounts:
        counts = ClassificationCounts(n_classes, keep_samples=keep)
        for lo, batch in zip(range(0, n_images, BATCH), logit_batches(images, classifier, BATCH), strict=True):
            counts.add(batch, targets[lo : lo + len(batch)])
        counts.metrics()
        return counts

    def with_evidence() -> Any:
        samples = score(True).samples()
        return classification_evidence(samples, n_classes, resamples=RESAMPLES)

    without, rows_only, with_rows = best_of(repeats, lambda: score(False), lambda: score(True).samples(),
                                            with_evidence)
    samples = score(True).samples()
    [bootstrap] = best_of(repeats, lambda: classification_evidence(samples, n_classes, resamples=RESAMPLES))
    evidence = with_evidence()
    size = parquet_bytes(evidence, "zeroshot_classification")
    print(f"(a) zero-shot classification, {n_images:,} images x {n_classes:,} classes, {dim}-d")
    print(f"    without sample rows {without}; with sample rows {rows_only}, ratio {rows_only.ratio(without)}; "
          f"with sample rows + intervals {with_rows}, ratio {with_rows.ratio(without)} (target <= 1.2x)")
    print(f"    intervals alone (acc1, acc5, mean per-class recall; {RESAMPLES} resamples): {bootstrap} "
          f"(target < 1 s)")
    print(f"    sample rows: {size / 2**20:.2f} MB of Parquet (target <= 3 MB per 50,000)")


def retrieval(n_images: int, per_image: int, dim: int, repeats: int) -> None:
    ks, budget = [1, 5, 10], tile_bytes(torch.device("cpu"))
    sets = {name: retrieval_set(np.random.default_rng(0), n_images, per_image, dim, ties)
            for name, ties in (("tie-free", False), ("tie-heavy", True))}
    n_captions = n_images * per_image
    index = (np.arange(n_captions), np.arange(n_images))

    def with_evidence(c: torch.Tensor, i: torch.Tensor, o: torch.Tensor, resamples: int = RESAMPLES) -> Any:
        text, image = query_outcomes(c, i, o, ks, budget)
        return zeroshot_retrieval_evidence(RetrievalQueries(text, image, ks, *index), resamples=resamples)

    sides: list[Callable[[], Any]] = []
    for c, i, o in sets.values():
        sides += [lambda c=c, i=i, o=o: recall_counts(c, i, o, ks, budget),
                  lambda c=c, i=i, o=o: with_evidence(c, i, o)]
    free_bare, free_rows, tied_bare, tied_rows = best_of(repeats, *sides)  # all four alternating, in one run
    print(f"(b) zero-shot retrieval, {n_images:,} images x {n_captions:,} captions ({per_image} per image), {dim}-d")
    for name, bare, rows in (("tie-free", free_bare, free_rows), ("tie-heavy", tied_bare, tied_rows)):
        c, i, o = sets[name]
        text, image = query_outcomes(c, i, o, ks, budget)
        counts = recall_counts(c, i, o, ks, budget)
        tied = sum(counts[0].tied.values()) + sum(counts[1].tied.values())
        print(f"    {name}: recall pass without sample rows {bare}; with sample rows (rank, top 3, per-query hits) "
              f"+ intervals {rows}; ratio {rows.ratio(bare)}{' (target <= 1.3x)' if name == 'tie-heavy' else ''}")
        print(f"      tie-sensitive (query, k): {tied}; exact rows recomputed: without rows text "
              f"{counts[0].decided_exactly}, image {counts[1].decided_exactly}; with rows text "
              f"{text.decided_exactly}, image {image.decided_exactly}")
    print(f"    tie-heavy with rows / tie-free with rows: {tied_rows.ratio(free_rows)} (target <= 1.5x)")
    c, i, o = sets["tie-free"]
    text, image = query_outcomes(c, i, o, ks, budget)
    queries = RetrievalQueries(text, image, ks, *index)
    rows_only, with_intervals = best_of(repeats, lambda: zeroshot_retrieval_evidence(queries, resamples=0),
                                        lambda: zeroshot_retrieval_evidence(queries, resamples=RESAMPLES))
    evidence = zeroshot_retrieval_evidence(queries, resamples=RESAMPLES)
    size = parquet_bytes(evidence, "zeroshot_retrieval")
    n_rows = sum(len(p.columns["sample_index"]) for p in evidence.parts())
    print(f"    evidence from the outcomes (tie-free): rows only {rows_only}; rows + intervals (recall@1/5/10 both "
          f"ways; {RESAMPLES} resamples) {with_intervals}")
    print(f"    sample rows: {n_rows:,} rows, {size / 2**20:.2f} MB of Parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=50_000, help="classification images")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--retrieval-images", type=int, default=5000)
    parser.add_argument("--captions-per-image", type=int, default=5)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("classification", "retrieval"))
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's; 1 gives steadier numbers on a "
                                                     "shared machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores; best of {args.repeats}, sides "
          f"alternating")
    if args.only != "retrieval":
        classification(args.images, args.classes, args.dim, args.repeats)
    if args.only != "classification":
        retrieval(args.retrieval_images, args.captions_per_image, args.dim, args.repeats)


if __name__ == "__main__":
    main()
