"""Leaderboard query over 1,000,000 metric rows in 10,000 Parquet files, before and after `results compact`.

    .venv/bin/python benchmarks/warehouse_query.py [--files 10000] [--rows_per_file 100]

Writes the files through the real writer (storage/results.py), times the leaderboard query (latest run per
model x dataset, main metric) through the `metrics` view, compacts, checks row count and checksum are unchanged, and
times the query again. Target: < 1 s after compaction.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clipcache.storage.compaction import compact  # noqa: E402
from clipcache.storage.results import write_metric_rows  # noqa: E402
from clipcache.storage.warehouse import connect  # noqa: E402

LEADERBOARD = """
with latest as (
    select *, dense_rank() over (partition by model, dataset, split, language, task
                                 order by created_at desc, run_id desc) as recency
    from metrics
)
select model, dataset, task,
       coalesce(max(case when metric = 'acc' and k = 1 then value end),
                avg(case when metric like '%retrieval_recall' and k = 5 then value end)) as main_value
from latest where recency = 1
group by all order by dataset, main_value desc
"""


def write_files(out: Path, files: int, rows_per_file: int) -> None:
    rng = np.random.default_rng(0)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    metrics = [("acc", 1), ("acc", 5), ("mean_per_class_recall", None)] + \
              [(f"{d}_retrieval_recall", k) for d in ("image", "text") for k in (1, 5, 10)]
    for f in range(files):
        run_id = f"run{f:06d}"
        rows = []
        for i in range(rows_per_file):
            metric, k = metrics[i % len(metrics)]
            rows.append({"run_id": run_id, "created_at": t0 + timedelta(minutes=f), "model": f"model-{f % 50}",
                         "pretrained": None, "model_fingerprint": "x", "dataset": f"dataset-{(i // 9) % 43}",
                         "split": "test", "language": "en",
                         "task": "zeroshot_retrieval" if "retrieval" in metric else "zeroshot_classification",
                         "metric": metric, "k": k, "value": float(rng.random()), "higher_is_better": True,
                         "n_samples": 1000, "cache_keys": ["a"], "clipcache_version": "0.1.0"})
        write_metric_rows(out, run_id, rows)


def timed_query(out: Path, repeats: int = 3) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeats):
        con = connect(out)
        start = time.perf_counter()
        n = len(con.sql(LEADERBOARD).fetchall())
        best = min(best, time.perf_counter() - start)
        con.close()
    return best, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rows_per_file", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.perf_counter()
        write_files(out, args.files, args.rows_per_file)
        write_s = time.perf_counter() - start
        before_s, n_rows = timed_query(out)
        start = time.perf_counter()
        report = compact(out, "metrics")
        compact_s = time.perf_counter() - start
        after_s, n_rows_after = timed_query(out)
    assert n_rows == n_rows_after and report.rows_before == report.rows_after == args.files * args.rows_per_file
    assert report.checksum_before == report.checksum_after
    print(f"{report.rows_before:,} metric rows in {args.files:,} files (written in {write_s:.0f} s)")
    print(f"leaderboard query, {args.files:,} files : {before_s:7.2f} s ({n_rows} leaderboard rows)")
    print(f"compaction                     : {compact_s:7.1f} s -> {report.files_after} file, rows and checksum "
          f"unchanged ({report.checksum_after})")
    print(f"leaderboard query, compacted   : {after_s:7.3f} s (target < 1 s; {before_s / after_s:.0f}x faster)")


if __name__ == "__main__":
    main()
