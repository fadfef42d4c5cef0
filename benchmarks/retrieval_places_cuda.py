"""On a GPU: per-query places (rank, best positive, top 3) and hits from the CUDA pass equal the CPU pass's (which
tests/test_retrieval_places.py holds equal to a brute-force reference and clip_benchmark), on repeated captions and
duplicate images, with the exact entries in blocks and from the small matrix; then the 5,000 x 25,000 tie-free and
tie-heavy sets of sample_rows.py on CUDA, with and without rows. Needs only numpy and torch (a lent GPU machine).

    python3 benchmarks/retrieval_places_cuda.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retrieval_sets import retrieval_set  # noqa: E402

from clipcache.tasks.score import retrieval_pass  # noqa: E402
from clipcache.tasks.score.device import tile_bytes  # noqa: E402
from clipcache.tasks.score.retrieval_pass import query_outcomes, recall_counts  # noqa: E402


def compare(c: torch.Tensor, i: torch.Tensor, o: torch.Tensor, ks: list[int], budget: int) -> None:
    cpu = query_outcomes(c, i, o, ks, budget)
    gpu = query_outcomes(c.cuda(), i.cuda(), o.cuda(), ks, budget, topk_device=torch.device("cpu"), host=(c, i))
    for name, a, b in zip(("t2i", "i2t"), cpu, gpu, strict=True):
        for field in ("hits", "tied", "positive", "rank", "top"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), (name, field)
        assert np.allclose(a.score, b.score, rtol=0, atol=1e-6, equal_nan=True), name
        print(f"  {name}: equal to the CPU pass ({len(a.rank)} queries, {int(a.tied.any(axis=1).sum())} tied, "
              f"exact rows CPU {a.decided_exactly} / CUDA {b.decided_exactly})")


def best_of(run: Callable[[], object], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    assert torch.cuda.is_available(), "needs a GPU"
    print(torch.cuda.get_device_name(), torch.__version__)
    for small in (True, False):
        retrieval_pass.SMALL_MATRIX = (1 << 22) if small else 0
        for ties in (False, True):
            print(f"600 images x 3,000 captions, ties={ties}, exact entries from "
                  f"{'the small matrix' if small else 'blocks'}")
            compare(*retrieval_set(np.random.default_rng(1), 600, 5, 64, ties), [1, 5, 10], 1 << 22)
    retrieval_pass.SMALL_MATRIX = 1 << 22
    for ties in (False, True):
        time_set(ties)


def time_set(ties: bool) -> None:
    ks, budget = [1, 5, 10], tile_bytes(torch.device("cuda"))
    c, i, o = retrieval_set(np.random.default_rng(0), 5000, 5, 512, ties)
    dc, di, do = c.cuda(), i.cuda(), o.cuda()
    bare = best_of(lambda: recall_counts(dc, di, do, ks, budget, host=(c, i)))
    rows = best_of(lambda: query_outcomes(dc, di, do, ks, budget, host=(c, i)))
    print(f"5,000 x 25,000 {'tie-heavy' if ties else 'tie-free'} on CUDA: without rows {bare:.3f} s, with rows "
          f"{rows:.3f} s ({rows / bare:.2f}x)")


if __name__ == "__main__":
    main()
