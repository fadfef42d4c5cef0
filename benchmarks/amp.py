"""``--amp`` on the device: its speed against fp32 for both towers, and its numbers against clip_benchmark's ``--amp``.

    python benchmarks/amp.py [--device cuda] [--models ViT-B-32 ViT-L-14] [--batch_size 256] [--batches 8]
    python benchmarks/amp.py --parity [--device cuda] [--samples 1000]

Speed (default): for each of ``--models`` (random weights: no hub is reachable; throughput does not depend on them),
loaded once by clipcache in fp32, the image tower on pixels already on the device and the text tower on tokens already
on the device, each timed in fp32, under clipcache's ``--amp`` (fp16 autocast on CUDA, bf16 on the CPU: the model's
own ``image_features`` / text path with autocast on) and under bf16 autocast; ``--batches`` batches of
``--batch_size``, after warm-up, best of ``--repeats``. Prints images/s and texts/s and the ratio to fp32 (issue #44's
target: ViT-L-14's image tower at least 2x fp32 under ``--amp``).

Parity (``--parity``): writes webdataset shards (JPEG, the bundled tiny model's shapes, ``--samples`` each) for
retrieval and classification, runs LAION clip_benchmark's own CLI on them with its default ``--amp`` (fp16 autocast on
CUDA, bf16 on the CPU) and ``clipcache eval --amp`` on the same shards, batch size and device, and compares every
metric both report (recall@1/5/10, acc1/acc5, mean per-class recall): equal, or the difference printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "tasks" / "models" / "assets" / "tiny-shapes-clip"
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

AMP_TARGET = ("ViT-L-14", "image", 2.0)


def best_rate(run, count: int, repeats: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    run()  # warm-up (cuBLAS picks its kernels, autocast caches its casts)
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - start)
    return count / best


def speed(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}; batch {args.batch_size} x {args.batches}, best of {args.repeats}; "
          f"items/s (ratio to fp32)")
    verdicts = [line for arch in args.models for line in speed_of(arch, args, device)]
    for line in verdicts:
        print(f"target: {line}")


def speed_of(arch: str, args: argparse.Namespace, device: torch.device) -> list[str]:
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.models.resolve import load_model, resolve_model
    from clipcache.tasks.models.spec import ModelSpec

    amp_name = "fp16" if device.type == "cuda" else "bf16"
    model = load_model(resolve_model(ModelSpec(model_name=arch), FileHashMemo(None)), device, False, None)
    size = model.module.visual.image_size
    size = size if isinstance(size, int) else size[0]
    pixels = torch.randn(args.batch_size, 3, size, size, device=device)
    tokens = model.tokenize([f"a photo of a thing number {i}" for i in range(args.batch_size)]).to(device)
    n = args.batch_size * args.batches

    def image(mode: str) -> None:
        for _ in range(args.batches):
            if mode == "bf16":  # not what --amp runs on CUDA: bf16 autocast, for comparison
                with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
                    F.normalize(model._encode_image(pixels), dim=-1).float()
            else:
                model.amp = mode == "amp"
                model.image_features(pixels)  # clipcache's own image path, autocast as --amp runs it

    def text(mode: str) -> None:
        dtype = {"bf16": torch.bfloat16, "amp": torch.float16 if device.type == "cuda" else torch.bfloat16}.get(mode)
        for _ in range(args.batches):
            with torch.inference_mode(), torch.autocast(device.type, dtype=dtype) if dtype else nullcontext():
                F.normalize(model._encode_text(tokens), dim=-1).float()  # clipcache's text path, no tokenizing

    verdicts = []
    for tower, fn in (("image", image), ("text", text)):
        rates = {mode: best_rate(lambda mode=mode, fn=fn: fn(mode), n, args.repeats, device)
                 for mode in ("fp32", "amp", "bf16")}
        cells = "   ".join(f"{'--amp (' + amp_name + ')' if m == 'amp' else m} {r:9.0f} ({r / rates['fp32']:.2f}x)"
                           for m, r in rates.items())
        print(f"  {arch:10s} {tower:5s}  {cells}")
        if (arch, tower) == AMP_TARGET[:2]:
            ratio = rates["amp"] / rates["fp32"]
            verdicts.append(f"{arch} {tower} tower --amp / fp32: {ratio:.2f}x (target >= {AMP_TARGET[2]:.1f}x: "
                            f"{'met' if ratio >= AMP_TARGET[2] else 'NOT met'})")
        sys.stdout.flush()
    model.amp = False
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return verdicts


def run(command: list[str], env: dict[str, str], cwd: Path) -> float:
    """Seconds ``command`` took; its output only when it fails (then this script fails too)."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        print(f"{' '.join(command[:4])} ... exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        raise SystemExit(1)
    return time.perf_counter() - started


def parity(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import write_wds

    device = args.device
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           "CLIPCACHE_CPU_BF16": "1",  # on a CPU without bf16 clipcache would run fp32 (clip_benchmark still bf16)
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    mismatches = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env["PREFECT_HOME"] = str(work / "prefect")
        for kind, task in (("retrieval", "zeroshot_retrieval"), ("classification", "zeroshot_classification")):
            root = write_wds(work / kind, kind, args.samples, shards=2, fmt="jpg")
            common = ["--dataset", f"wds/{kind}", "--dataset_root", str(root), "--task", task,
                      "--batch_size", str(args.batch_size), "--recall_k", "1", "5", "10"]
            theirs_file, ours_file = work / f"cb_{kind}.json", work / f"ours_{kind}.json"
            peer_s = run([sys.executable, "-m", "clip_benchmark.cli", "eval", "--model", f"local-dir:{MODEL}",
                          "--pretrained", "", "--num_workers", "1", *common, "--output", str(theirs_file)], env, work)
            ours_s = run([sys.executable, "-m", "clipcache.flows.cli.app", "eval", "--model", "tiny-shapes-clip", *common,
                          "--amp", "--device", device, "--num_workers", "2", "--output", str(ours_file),
                          "--output_dir", str(work / "out"), "--cache_dir", str(work / "cache"), "--quiet",
                          "--bootstrap", "0"], env, work)
            theirs = json.loads(theirs_file.read_text())["metrics"]
            ours = json.loads(ours_file.read_text())["metrics"]
            shared = sorted(set(theirs) & set(ours))
            differ = [k for k in shared if ours[k] != theirs[k]]
            mismatches += len(differ) + (not shared)
            print(f"{task} ({args.samples} samples, --amp on {device}; clip_benchmark {peer_s:.1f} s, "
                  f"clipcache {ours_s:.1f} s): {len(shared) - len(differ)} of {len(shared)} metrics equal")
            for k in shared:
                print(f"  {k:28s} clip_benchmark {theirs[k]!r:24} clipcache {ours[k]!r:24}"
                      + ("" if ours[k] == theirs[k] else "  DIFFERS"))
    print(f"parity with clip_benchmark --amp: {'every metric equal' if not mismatches else f'{mismatches} differ'}")
    if mismatches:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", default=["ViT-B-32", "ViT-L-14"])
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--parity", action="store_true", help="compare with clip_benchmark's --amp run instead")
    parser.add_argument("--samples", type=int, default=1000)
    args = parser.parse_args()
    parity(args) if args.parity else speed(args)


if __name__ == "__main__":
    main()
