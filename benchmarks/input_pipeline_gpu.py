"""The CUDA section of benchmarks/input_pipeline.py: encode throughput against the forward pass alone and the peer.

Run through ``benchmarks/input_pipeline.py`` (which writes the JPEGs); ``bash benchmarks/gpu_checks.sh`` runs it on a
GPU machine. On ``--gpu_images`` images (the 1,200 files repeated) it measures, best of ``--gpu_repeats``:

- what the CPUs decode with no model (clipcache's pool at each ``--gpu_workers`` count, the DataLoader with one
  worker per core), and what ``--decode gpu`` decodes with no model (readers + nvJPEG + device resize);
- for each of ``--gpu_models`` (random weights, fp16 autocast): the forward pass alone on pixels already on the device
  (the ceiling), clip_benchmark's loop (DataLoader, forward, vectors to the host: the peer), and clipcache's encode
  stage (decoding, overlap, Zarr writes) with ``--decode cpu`` at each worker count and ``--prefetch``, and with
  ``--decode gpu``;
- ``--decode gpu``'s difference from PIL decoding (pixels and vectors) and who decoded what;
- the issue's targets as ratios measured in this run: ``--decode gpu`` >= 0.6x the ceiling for ViT-B-32 and >= 0.9x
  for ViT-L-14, ``--decode cpu`` with one worker per core >= 1.0x the peer.

``--gpu_device cpu`` dry-runs the section on the CPU (tiny sizes; the encode with ``--decode gpu`` needs CUDA and is
left out there).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from clipcache.tasks.datasets.labelled import load_imagefolder
from clipcache.tasks.encode.batches import process_batches
from clipcache.tasks.encode.preprocess import lower

TARGETS = {("ViT-B-32", "gpu", "ceiling"): 0.6, ("ViT-L-14", "gpu", "ceiling"): 0.9}
CPU_TARGET = 1.0  # --decode cpu with one worker per core, against the peer's loop


def drain(batches) -> int:
    return sum(1 for _ in batches or ())


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x (target >= {target:.1f}x: {'met' if ratio >= target else 'NOT met'})"


def gpu_section(args: argparse.Namespace, root: Path, peer_loader: Callable) -> None:
    if not torch.cuda.is_available() and args.gpu_device == "cuda":
        print("CUDA: not available here; skipped the GPU encode throughput and the --decode gpu measurements")
        return
    import torch.nn.functional as F
    from open_clip.transform import image_transform

    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.contract import EncodeSettings
    from clipcache.tasks.encode.decode_pool import DecodePool
    from clipcache.tasks.encode.gpu_decode import DecodeCounts, gpu_batches
    from clipcache.tasks.encode.stage import ModelSession, encode_images, image_key_fields
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec
    from clipcache.tasks.progress import StageProgress

    device = torch.device(args.gpu_device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    base = load_imagefolder("bench", root, "test", None)
    k = max(1, args.gpu_images // len(base))  # the same files k times: GPU rates need more than 1,200 images
    dataset = replace(base, image_paths=base.image_paths * k, origins=base.origins * k,
                      labels=np.tile(base.labels, k))
    n, bs = len(dataset), args.gpu_batch_size
    cores = len(os.sched_getaffinity(0))
    workers = args.gpu_workers or [cores]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "a dry run on the CPU"
    print(f"CUDA: {name}, torch {torch.__version__}, {cores} cores; random weights, fp16 autocast, batch {bs}, "
          f"{n} images ({len(base)} files x {k}); images/s, best of {args.gpu_repeats}")

    portable = lower(image_transform(224, is_train=False))
    ranges = [(lo, min(lo + bs, n)) for lo in range(0, n, bs)]
    decoding: dict[str, float] = {}
    for w in workers:  # what the CPUs decode with no model at all: the ceiling of --decode cpu
        for prefetch in args.gpu_prefetch:
            pool = DecodePool(w)
            drain(process_batches(pool, dataset, portable, ranges[:w]))  # started and warm, as in a flow run
            decoding[f"clipcache decoding processes x{w}, prefetch {prefetch}, no model"] = n / min(
                timed(lambda pool=pool, p=prefetch: drain(process_batches(pool, dataset, portable, ranges,
                                                                           prefetch=p)))
                for _ in range(args.gpu_repeats))
            pool.close()
    peer_decoding = peer_loader(root, image_transform(224, is_train=False), bs, cores, repeat=k)
    decoding[f"clip_benchmark DataLoader x{cores}, no model"] = n / min(
        timed(lambda: drain(iter(peer_decoding))) for _ in range(args.gpu_repeats))
    for label, rate in decoding.items():
        print(f"  {label:58s} {rate:8.0f}")
    sys.stdout.flush()
    verdicts: list[str] = []

    def measure(arch: str) -> ModelSession:
        session = ModelSession(resolve_model(ModelSpec(model_name=arch), FileHashMemo(None)), device, True,
                               "amp_fp16")
        model = session.model
        rates: dict[str, float] = {}

        def best(label: str, run: Callable[[], int]) -> None:
            for _ in range(args.gpu_repeats):
                synchronize()
                t = time.perf_counter()
                count = run()
                synchronize()
                rates[label] = max(rates.get(label, 0.0), count / (time.perf_counter() - t))

        shape = tuple(model.image_transform(base.load_image(0)).shape)
        pixels = torch.randn(bs, *shape, device=device)
        for _ in range(3):
            model.image_features(pixels)

        def forward_alone() -> int:
            for _ in range(n // bs):
                model.image_features(pixels)
            return n // bs * bs

        best("forward pass alone (the ceiling)", forward_alone)
        loader = peer_loader(root, image_transform(shape[-1], is_train=False), bs, cores, repeat=k)

        def plain_loop() -> int:
            count = 0
            with torch.inference_mode(), torch.autocast(device.type, dtype=torch.float16):
                for images, _ in loader:  # clip_benchmark's loop: DataLoader, forward, vectors to the host
                    F.normalize(model.module.encode_image(images.to(device)), dim=-1).float().cpu()
                    count += len(images)
            return count

        peer_name = f"plain DataLoader loop, {cores} workers (the peer)"
        best(peer_name, plain_loop)
        counts = DecodeCounts()
        best("--decode gpu, decoding alone (no model)",
             lambda: sum(len(b.indices) for b in gpu_batches(dataset, model, 0, bs, cores, device=device,
                                                             counts=counts)))
        variants = [("cpu", w, p) for w in workers for p in args.gpu_prefetch]
        variants += [("gpu", cores, p) for p in args.gpu_prefetch] * (device.type == "cuda")
        for decode, w, prefetch in variants:
            s = replace(session, decode=decode)
            fields = image_key_fields(s, {"bench": n}, "test", None)

            def ours(s=s, fields=fields, w=w, prefetch=prefetch) -> int:
                with tempfile.TemporaryDirectory() as cache:
                    encode_images(s, dataset, EmbeddingStore(cache), fields,
                                  EncodeSettings(bs, num_workers=w, decode_pool="processes", prefetch=prefetch),
                                  StageProgress(enabled=False))
                return n

            label = f"clipcache encode --decode {decode}" + (f", {w} workers" if decode == "cpu" else "")
            best(label + f", prefetch {prefetch}", ours)
        ceiling, peer = rates["forward pass alone (the ceiling)"], rates[peer_name]
        print(f"  {arch}:")
        for label, rate in rates.items():
            print(f"    {label:52s} {rate:8.0f}   {rate / ceiling:5.2f}x ceiling   {rate / peer:5.2f}x peer")
        print(f"    who decoded what under --decode gpu (all runs): {counts.describe()}")
        for label, rate in rates.items():
            if label.startswith("clipcache encode --decode gpu") and (arch, "gpu", "ceiling") in TARGETS:
                verdicts.append(f"{arch} {label[17:]}: {verdict(rate / ceiling, TARGETS[arch, 'gpu', 'ceiling'])}"
                                f" of the forward pass alone")
            if label.startswith(f"clipcache encode --decode cpu, {cores} workers"):
                verdicts.append(f"{arch} {label[17:]}: {verdict(rate / peer, CPU_TARGET)} of the peer's loop")
        sys.stdout.flush()
        return session

    sessions = [measure(arch) for arch in args.gpu_models]
    model = sessions[0].model
    sample = load_imagefolder("bench", root, "test", 512)
    pil = torch.stack([model.image_transform(sample.load_image(i)) for i in range(len(sample))]).to(device)
    gpu = torch.cat([b.pixels for b in gpu_batches(sample, model, 0, bs, None, device=device)])
    diff = (gpu - pil).abs()
    with torch.inference_mode():
        cos = (model.image_features(gpu) * model.image_features(pil)).sum(-1)
    print(f"  --decode gpu vs PIL on {len(sample)} images: pixels (normalised units) mean |diff| "
          f"{diff.mean():.4f}, max {diff.max():.3f}; vector cosine mean {cos.mean():.6f}, min {cos.min():.6f}")
    print("targets (ratios measured in this run):")
    for line in verdicts:
        print(f"  {line}")
