"""Whole-process times of the CLI, from process start to exit, side by side with clip_benchmark in one run.

    .venv/bin/python benchmarks/cli_latency.py [--images 1200] [--repeat 5]

- `clipcache rescore` of a fully cached pair (the bundled tiny model on 1,200 shapes images in the webdataset
  layout) against `clip_benchmark eval` of the same pair from scratch (what a user of clip_benchmark waits for);
  targets: <= 3 s, and at most half of clip_benchmark's time;
- a bad name (dataset, model, task) and a bad flag value failing with its suggestion (target <= 1.5 s);
- `clipcache --help` (target <= 0.5 s);
- importing torch alone, the floor of any rescore (its scoring runs torch's kernels, as clip_benchmark does, for
  equal bits), and the rescore's time above it: on a slower machine the torch import grows and so does the rescore.
Each command runs --repeat times in fresh processes (no Prefect server configured: the local orchestrator); the
minimum and the median are printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MODEL = REPO / "tasks" / "models" / "assets" / "tiny-shapes-clip"


def timed(command: list[str], repeat: int, expect: int = 0, cwd: Path | None = None) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
        times.append(time.perf_counter() - start)
        if done.returncode != expect:
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return times


def show(label: str, times: list[float], target: str = "") -> float:
    best = min(times)
    print(f"{label:48s} min {best:6.2f} s  median {statistics.median(times):6.2f} s  {target}")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import write_wds

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = write_wds(work / "shapes_cls", "classification", args.images, shards=2)
        common = ["--dataset", "wds/shapes_cls", "--dataset_root", str(root), "--batch_size", "64",
                  "--num_workers", "2"]
        clipcache = [str(BIN / "clipcache")]
        ours = [*clipcache, "rescore", "--model", "tiny-shapes-clip", *common, "--output_dir", str(work / "out"),
                "--cache_dir", str(work / "cache"), "--quiet"]
        timed([*clipcache, "eval", *ours[2:]], 1, cwd=work)  # fill the cache once
        rescore = show("clipcache rescore (cached pair)", timed(ours, args.repeat, cwd=work), "(target <= 3 s)")
        peer_cmd = [str(BIN / "clip_benchmark"), "eval", "--model", f"local-dir:{MODEL}", "--pretrained", "",
                    "--no_amp", *common, "--output", str(work / "cb_{dataset}.json")]
        peer = show("clip_benchmark eval of the same pair", timed(peer_cmd, max(2, args.repeat // 2), cwd=work))
        print(f"{'rescore / clip_benchmark':48s} {rescore / peer:.2f} (target <= 0.5)")
        # the floor no rescore can go under: scoring runs torch (clip_benchmark's kernels, for equal bits)
        floor = show("python -c 'import torch' (the floor)", timed([sys.executable, "-c", "import torch"],
                                                                    args.repeat, cwd=work))
        print(f"{'rescore above the torch import':48s} {rescore - floor:6.2f} s")
        for label, argv in (("bad dataset name", ["--dataset", "shpaes"]),
                            ("bad model name", ["--model", "tiny-shapes-clp", "--dataset", "shapes"]),
                            ("bad task", ["--task", "zeroshot_clasification", "--dataset", "shapes"]),
                            ("bad flag value (--ties)", ["--ties", "random", "--dataset", "shapes"])):
            model = [] if "--model" in argv else ["--model", "tiny-shapes-clip"]
            show(f"clipcache eval, {label}", timed([*clipcache, "eval", *model, *argv], args.repeat, expect=2,
                                                   cwd=work), "(target <= 1.5 s)")
        show("clipcache --help", timed([*clipcache, "--help"], args.repeat, cwd=work), "(target <= 0.5 s)")


if __name__ == "__main__":
    main()
