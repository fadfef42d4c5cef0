"""Input-pipeline throughput: clipcache's decoding processes and threads vs clip_benchmark's DataLoader, model = no-op.

    .venv/bin/python benchmarks/input_pipeline.py [--images 1200] [--batch_size 64] [--repeats 5] [--workers 1 2]

Writes ``--images`` JPEGs of 500x375 (deterministic content) into a temporary imagefolder, then measures images/s of
decoding + ViT-B-32 preprocessing (Resize 224 bicubic, CenterCrop, ToTensor, Normalize) into batches, with the model
replaced by nothing:

- a single-threaded floor (a plain loop: decode, transform, stack; no pipeline);
- clipcache, worker processes (the pool started beforehand; its start is reported apart) and threads;
- clip_benchmark's loader for the same files: torchvision ``ImageFolder`` + ``torch.utils.data.DataLoader(...,
  shuffle=False, num_workers=N, collate_fn=get_dataset_collate_fn(...))``, as its CLI builds it;

each at every ``--workers`` count, order rotated between repeats, best of ``--repeats`` (ratios: the median of the
ratios within each repeat). Also two independent processes running the floor on half the images each: what 2 cores
give on this machine with no coordination at all (a VM's 2 vCPUs may share a physical core). Then the per-image cost of
read / decode / resize+crop / tensor conversion (single thread), each pipeline's 1 -> 2 worker scaling and the
serialised fraction it implies (Amdahl: s = 2/S - 1 for a speed-up S on 2 workers; a pool cannot beat 1/s).

``--sweep 1 2 4 8 16`` measures instead how decoding scales with workers (clipcache's processes at each
``--sweep_prefetch``, clip_benchmark's DataLoader), on ``--sweep_images_per_worker`` images per worker (the files
repeated as needed): a Markdown table for docs/input_pipeline.md.

Where CUDA is available it also runs the CUDA section (benchmarks/input_pipeline_gpu.py: encode throughput against
the forward pass alone and the peer's loop, ``--decode cpu`` and ``--decode gpu``, and the issue's targets), else
says it skipped it. ``--no_cpu`` / ``--no_gpu`` skip a section. ``bash benchmarks/gpu_checks.sh`` runs it on a GPU
machine with the CUDA tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from clipcache.tasks.datasets.labelled import load_imagefolder  # noqa: E402
from clipcache.tasks.encode.batches import process_batches, thread_batches  # noqa: E402
from clipcache.tasks.encode.preprocess import lower  # noqa: E402


def write_jpegs(root: Path, n: int) -> Path:
    """``n`` 500x375 JPEGs (quality 90) in 4 class folders: smooth gradients, shapes and noise, seeded."""
    from PIL import ImageDraw

    rng = np.random.default_rng(30)
    yy, xx = np.mgrid[0:375, 0:500].astype(np.float32)
    for i in range(n):
        folder = root / f"class{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        a, b, c = rng.uniform(0.2, 1.0, 3)
        base = np.stack([xx * a / 2, yy * b / 1.5, (xx + yy) * c / 3.5], axis=-1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        draw = ImageDraw.Draw(image)
        for _ in range(6):
            x0, y0 = int(rng.integers(0, 450)), int(rng.integers(0, 325))
            box = (x0, y0, x0 + int(rng.integers(20, 200)), y0 + int(rng.integers(20, 150)))
            colour = tuple(int(v) for v in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
        image.save(folder / f"{i:05d}.jpg", quality=90)
    return root


def drain(batches: Iterator[object] | None) -> int:
    """The model: nothing. Counts the batches (a pipeline must still produce every one)."""
    return sum(1 for _ in batches or ())


def timed(fn: Callable[[], int]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def plain_loop(dataset, transform, batch_size: int) -> int:
    count = 0
    for lo in range(0, len(dataset), batch_size):
        torch.stack([transform(dataset.load_image(i)) for i in range(lo, min(lo + batch_size, len(dataset)))])
        count += 1
    return count


_CEILING_JOB: tuple = ()  # (dataset, transform, batch size), inherited by the forked processes of ``ceiling``


def _floor_part(part: tuple[int, int]) -> int:
    dataset, transform, bs = _CEILING_JOB
    lo, hi = part
    for start in range(lo, hi, bs):
        torch.stack([transform(dataset.load_image(i)) for i in range(start, min(start + bs, hi))])
    return hi - lo


def independent_processes(dataset, transform, bs: int):
    """What 2 cores give on this machine with no coordination at all (a VM's 2 vCPUs may share a physical core):
    the single-threaded floor in one process, and in two independent processes on half the images each."""
    global _CEILING_JOB
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    _CEILING_JOB = (dataset, transform, bs)
    n = len(dataset)
    halves = [(0, n // 2 // bs * bs), (n // 2 // bs * bs, n)]
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))  # no Prefect in this process
    list(pool.map(_floor_part, [(0, 1), (1, 2)]))  # both processes started
    return pool, (lambda: pool.submit(_floor_part, (0, n)).result()), (lambda: sum(pool.map(_floor_part, halves)))


def peer_loader(root: Path, transform, batch_size: int, workers: int, repeat: int = 1, limit: int | None = None):
    """clip_benchmark's loader for a folder of images (its cli.py: ImageFolder, DataLoader, its collate_fn);
    ``repeat`` > 1 chains the folder that many times into one dataset (one epoch: workers start once), ``limit`` keeps
    its first images."""
    from clip_benchmark.datasets.builder import get_dataset_collate_fn
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(root=str(root), transform=transform)
    if repeat > 1:
        dataset = torch.utils.data.ConcatDataset([dataset] * repeat)
    if limit is not None:
        dataset = torch.utils.data.Subset(dataset, range(limit))
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                                       collate_fn=get_dataset_collate_fn("imagefolder"))


def cost_split(dataset, transform, n: int) -> dict[str, float]:
    """Microseconds per image of each step, one thread."""
    steps = transform.transforms  # Resize, CenterCrop, (convert,) ToTensor, Normalize
    resize = [s for s in steps if type(s).__name__ in ("Resize", "CenterCrop")]
    rest = [s for s in steps if s not in resize]
    totals = dict.fromkeys(("read", "decode", "resize + crop", "tensor conversion"), 0.0)
    for i in range(n):
        t0 = time.perf_counter()
        raw = dataset.read_image_bytes(i)
        t1 = time.perf_counter()
        import io

        with Image.open(io.BytesIO(raw)) as img:
            img.load()
            image = img.convert("RGB")
        t2 = time.perf_counter()
        for s in resize:
            image = s(image)
        t3 = time.perf_counter()
        for s in rest:
            image = s(image)
        t4 = time.perf_counter()
        for key, took in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            totals[key] += took
    return {k: v / n * 1e6 for k, v in totals.items()}


def cpu_section(args: argparse.Namespace, root: Path) -> None:
    from open_clip.transform import image_transform

    from clipcache.tasks.encode.decode_pool import DecodePool

    transform = image_transform(224, is_train=False)  # ViT-B-32's preprocessing
    portable = lower(transform)
    dataset = load_imagefolder("bench", root, "test", None)
    n, bs = len(dataset), args.batch_size
    ranges = [(lo, min(lo + bs, n)) for lo in range(0, n, bs)]
    started = time.perf_counter()
    forked, alone, together = independent_processes(dataset, transform, bs)  # forked before any socket exists
    pools, start_up = {}, {}
    for w in args.workers:  # one pool per size, started once (what a flow pays once per process) and kept warm
        t = time.perf_counter()
        pools[w] = DecodePool(w)
        drain(process_batches(pools[w], dataset, portable, ranges[:w]))
        start_up[w] = time.perf_counter() - t
    runs: dict[str, tuple[int, Callable[[], int]]] = {
        "single-threaded floor": (1, lambda: plain_loop(dataset, transform, bs)),
        "clip_benchmark DataLoader x0": (1, lambda: drain(iter(peer_loader(root, transform, bs, 0)))),
        "independent processes x1": (1, alone),
        "independent processes x2": (2, together),
    }
    for w in args.workers:
        runs[f"clipcache processes x{w}"] = (w, lambda w=w: drain(process_batches(pools[w], dataset, portable,
                                                                                   ranges)))
        runs[f"clipcache threads x{w}"] = (w, lambda w=w: drain(thread_batches(dataset, transform, ranges, w)))
        runs[f"clip_benchmark DataLoader x{w}"] = (w, lambda w=w: drain(iter(peer_loader(root, transform, bs, w))))
    runs = {name: run for name, run in runs.items() if not args.only or any(part in name for part in args.only)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.repeats):  # rotate the order so drift in machine load spreads over every pipeline
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(timed(runs[name][1]))
    for pool in pools.values():
        pool.close()
    forked.shutdown()
    best = {name: min(t) for name, t in times.items()}

    def paired(a: str, b: str) -> float:
        """Median over repeats of time(a) / time(b), both timed within the same repeat (load drifts slowly)."""
        return float(np.median([ta / tb for ta, tb in zip(times[a], times[b], strict=True)]))

    print(f"{n} JPEGs 500x375, batch {bs}, model = no-op; best of {args.repeats}; "
          f"{len(os.sched_getaffinity(0))} cores; load average before {args.load_before}, after "
          f"{tuple(round(x, 2) for x in os.getloadavg())}; {time.perf_counter() - started:.0f} s")
    for name in names:
        rate = n / best[name]
        print(f"  {name:32s} {rate:7.1f} images/s   {rate / runs[name][0]:6.1f} per worker")
    for w, seconds in start_up.items():
        print(f"  process pool start-up, {w} worker(s), with its first {w} batch(es): {seconds:.2f} s")
    if all(f"{label} x{w}" in runs for label in ("independent processes", "clipcache processes", "clipcache threads",
                                                  "clip_benchmark DataLoader") for w in (1, 2)):
        print("1 -> 2 workers, median of the per-repeat ratios (Amdahl: s = 2/S - 1 is the serialised fraction; "
              "1/s caps the speed-up):")
        for label in ("independent processes", "clipcache processes", "clipcache threads",
                      "clip_benchmark DataLoader"):
            speedup = paired(f"{label} x1", f"{label} x2")
            serial = min(1.0, max(0.0, 2 / speedup - 1))
            cap = f"{1 / serial:.0f}x" if serial > 1e-3 else "none measurable"
            print(f"  {label:28s} {speedup:.2f}x   s = {serial:.3f}   cap {cap}")
        print(f"  clipcache processes x2 / clip_benchmark DataLoader x2: "
              f"{paired('clip_benchmark DataLoader x2', 'clipcache processes x2'):.2f}x (median per repeat); "
              f"clipcache processes x1 / DataLoader x1: "
              f"{paired('clip_benchmark DataLoader x1', 'clipcache processes x1'):.2f}x")
    split = cost_split(dataset, transform, min(n, 400))
    total = sum(split.values())
    print("per-image cost, one thread: " + ", ".join(f"{k} {v:.0f} us ({v / total:.0%})" for k, v in split.items())
          + f"; total {total:.0f} us = {1e6 / total:.0f} images/s")


def sweep_section(args: argparse.Namespace, root: Path) -> None:
    """Decoding alone at each worker count: clipcache's processes (per --sweep_prefetch) and the DataLoader."""
    from dataclasses import replace

    from open_clip.transform import image_transform

    from clipcache.tasks.encode.decode_pool import DecodePool

    transform = image_transform(224, is_train=False)
    portable = lower(transform)
    base = load_imagefolder("bench", root, "test", None)
    bs = args.batch_size
    print(f"decoding alone (model = no-op), JPEGs 500x375, batch {bs}, {len(os.sched_getaffinity(0))} cores, "
          f"best of {args.repeats}; load average before {args.load_before}")
    columns = [f"clipcache processes, prefetch {p}" for p in args.sweep_prefetch] + ["clip_benchmark DataLoader"]
    print("| workers | images | " + " | ".join(f"{c} (images/s, per worker)" for c in columns)
          + " | clipcache / DataLoader |")
    print("|---:|---:|" + "---:|" * len(columns) + "---:|")
    for w in args.sweep:
        n = w * args.sweep_images_per_worker  # the files repeated as needed; the DataLoader reads the same ones
        k = -(-n // len(base))
        dataset = replace(base, image_paths=(base.image_paths * k)[:n], origins=(base.origins * k)[:n],
                          labels=np.tile(base.labels, k)[:n])
        ranges = [(lo, min(lo + bs, n)) for lo in range(0, n, bs)]
        rates = []
        for prefetch in args.sweep_prefetch:
            pool = DecodePool(w)
            drain(process_batches(pool, dataset, portable, ranges[:w]))  # started and warm, as in a flow run

            def decode(pool=pool, dataset=dataset, ranges=ranges, prefetch=prefetch) -> int:
                return drain(process_batches(pool, dataset, portable, ranges, prefetch=prefetch))

            rates.append(n / min(timed(decode) for _ in range(args.repeats)))
            pool.close()
        loader = peer_loader(root, transform, bs, w, repeat=k, limit=n)
        rates.append(n / min(timed(lambda loader=loader: drain(iter(loader))) for _ in range(args.repeats)))
        cells = " | ".join(f"{r:.0f} ({r / w:.0f})" for r in rates)
        print(f"| {w} | {n} | {cells} | {max(rates[:-1]) / rates[-1]:.2f}x |")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1200)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--only", nargs="+", help="time only the pipelines whose name holds one of these words")
    parser.add_argument("--sweep", type=int, nargs="+", help="decoding alone at these worker counts (a table), "
                        "instead of the CPU section")
    parser.add_argument("--sweep_images_per_worker", type=int, default=600)
    parser.add_argument("--sweep_prefetch", type=int, nargs="+", default=[2])
    parser.add_argument("--gpu_images", type=int, default=12_000)
    parser.add_argument("--gpu_batch_size", type=int, default=256)
    parser.add_argument("--gpu_models", nargs="+", default=["ViT-B-32", "ViT-L-14"])
    parser.add_argument("--gpu_repeats", type=int, default=2)
    parser.add_argument("--gpu_workers", type=int, nargs="+", help="decoding processes for --decode cpu "
                        "(default: one per core)")
    parser.add_argument("--gpu_prefetch", type=int, nargs="+", default=[2], help="batches per worker in flight")
    parser.add_argument("--gpu_device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a dry run of the section
    parser.add_argument("--no_gpu", action="store_true", help="skip the CUDA section")
    parser.add_argument("--no_cpu", action="store_true", help="skip the CPU section (GPU runs that time only it)")
    args = parser.parse_args()
    args.load_before = tuple(round(x, 2) for x in os.getloadavg())
    torch.set_num_threads(1)  # the no-op model needs none; the floor and the DataLoader's main process get one
    with tempfile.TemporaryDirectory() as tmp:
        root = write_jpegs(Path(tmp) / "jpegs", args.images)
        if args.sweep:
            sweep_section(args, root)
        elif not args.no_cpu:
            cpu_section(args, root)
        sys.stdout.flush()
        if not args.no_gpu:
            from input_pipeline_gpu import gpu_section

            gpu_section(args, root, peer_loader)


if __name__ == "__main__":
    main()
