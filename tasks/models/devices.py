"""Device choice and mixed precision.

Verified here on CPU only (no GPU on the development/CI machines); the CUDA branches follow torch's documented API:
``auto`` picks CUDA when available; ``--amp`` autocasts to bfloat16 on CPU and float16 on CUDA. The default is fp32,
which is what makes numbers equal to clip_benchmark ``--no_amp``.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from clipcache.storage.errors import ConfigError


def resolve_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as e:
        raise ConfigError(f"device: {requested!r} is not a torch device (expected auto, cpu, cuda or cuda:N)") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {requested!r} requested but CUDA is not available on this machine")
    return device


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX). Without it torch emulates bf16 and
    autocast is several times slower than fp32 (measured here on an AVX2-only CPU: ViT-B-32 0.16x)."""
    import os

    if os.environ.get("CLIPCACHE_CPU_BF16") in ("0", "1"):  # an explicit answer wins (tests, odd platforms)
        return os.environ["CLIPCACHE_CPU_BF16"] == "1"
    try:
        flags = set(open("/proc/cpuinfo", encoding="ascii", errors="replace").read().split())
    except OSError:
        return True  # not Linux: leave it to torch
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def effective_amp(device: torch.device, amp: bool) -> bool:
    """``--amp`` as it will run: on a CPU without bfloat16 instructions autocast would only slow encoding down, so it
    runs fp32 (said as a warning for each model it concerns; results and cache entries are then fp32's, which they
    equal)."""
    if amp and device.type == "cpu" and not cpu_has_bf16():
        import logging

        logging.getLogger("clipcache").warning(
            "--amp: this CPU has no bfloat16 instructions (AVX512-BF16 / AMX), so bf16 autocast would be several "
            "times slower than fp32 here; running fp32 (set CLIPCACHE_CPU_BF16=1 to force bf16)")
        return False
    return amp


def precision_name(device: torch.device, amp: bool) -> str:
    """The precision that actually runs, as it goes into cache keys and results."""
    if not amp:
        return "fp32"
    return "amp_fp16" if device.type == "cuda" else "amp_bf16"


def autocast(device: torch.device, amp: bool) -> Any:
    if not amp:
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16)
