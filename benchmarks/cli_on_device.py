"""The whole product through its CLI on one device: eval (Prefect flow, encode, cache, score, results), SQL, the
report (dbt + HTML) and a rescore from the cache, on the hosted webdataset layout written here.

    python benchmarks/cli_on_device.py [--device cuda] [--samples 2000] [--work DIR]

Writes JPEG webdataset shards (the bundled tiny model's shapes: retrieval with 1-3 captions per image, and
30-class classification; ``--samples`` each, 4 shards) as clip_benchmark's hosted datasets lay them out, then runs,
each as its own ``clipcache`` process in a fresh folder, failing at the first command that fails:

1. ``clipcache eval --device DEVICE --orchestrator prefect`` on both datasets (a Prefect flow run on a private
   server; ``--dataset_root DIR/{dataset_cleaned}``);
2. the same with ``--decode gpu`` on the retrieval set (CUDA only): nvJPEG decoding through the CLI, its own entries;
3. ``clipcache query`` over the results (the leaderboard and the runs);
4. ``clipcache report`` (dbt build, then the static HTML report), checked to exist;
5. ``clipcache rescore`` with other recall@k from the cache: no image decoded (its output says "cache hit").

Prints each command's exit status, time and the end of its output. ``bash benchmarks/gpu_checks.sh`` runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def clipcache(args: list[str], work: Path, env: dict[str, str], expect: str | None = None) -> str:
    command = [sys.executable, "-m", "clipcache.flows.cli.app", *args]
    print(f"$ clipcache {' '.join(args)}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    output = (done.stdout + done.stderr).strip()
    print("  " + "\n  ".join(output.splitlines()[-14:]))
    print(f"  -> exit {done.returncode} in {time.perf_counter() - started:.1f} s", flush=True)
    if done.returncode or (expect is not None and expect not in output):
        raise SystemExit(f"FAILED: clipcache {' '.join(args)}" + (f" (expected {expect!r} in its output)"
                                                                  if not done.returncode else ""))
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--work", help="keep everything in this folder (default: a temporary one)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import write_wds  # the real webdataset library, clip_benchmark's hosted layout

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        write_wds(work / "data" / "shapes_retrieval", "retrieval", args.samples, shards=4, fmt="jpg")
        write_wds(work / "data" / "shapes_cls", "classification", args.samples, shards=4, fmt="jpg")
        print(f"wrote {2 * args.samples} samples in 8 JPEG shards in {time.perf_counter() - started:.1f} s")
        env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "DO_NOT_TRACK": "1", "DBT_SEND_ANONYMOUS_USAGE_STATS": "False", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
        data = ["--dataset_root", str(work / "data" / "{dataset_cleaned}"), "--batch_size", str(args.batch_size),
                "--device", args.device, "--output_dir", "outputs", "--cache_dir", "cache"]
        clipcache(["eval", "--model", "tiny-shapes-clip", "--dataset", "wds/shapes_retrieval", "wds/shapes_cls",
                   "--orchestrator", "prefect", *data], work, env)
        if args.device.startswith("cuda"):
            clipcache(["eval", "--model", "tiny-shapes-clip", "--dataset", "wds/shapes_retrieval", "--decode", "gpu",
                       *data], work, env)
        clipcache(["query", "SELECT model, dataset, metric, k, round(value, 4) AS value FROM leaderboard "
                   "ORDER BY dataset, metric, k", "--output_dir", "outputs"], work, env, expect="shapes")
        clipcache(["query", "SELECT kind, status, device, count(*) AS runs FROM runs GROUP BY ALL ORDER BY kind",
                   "--output_dir", "outputs"], work, env, expect=args.device.split(":")[0])
        clipcache(["report", "--output_dir", "outputs"], work, env)
        report = work / "outputs" / "report" / "index.html"
        if not report.is_file():
            raise SystemExit(f"FAILED: no report at {report}")
        print(f"report: {report} ({report.stat().st_size} bytes)")
        clipcache(["rescore", "--model", "tiny-shapes-clip", "--dataset", "wds/shapes_retrieval", "--recall_k", "1",
                   "2", "3", *data], work, env, expect="cache hit")
        print(f"the whole product on {args.device}: every step passed in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
