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


def precision_name(device: torch.device, amp: bool) -> str:
    """The precision that actually runs, as it goes into cache keys and results."""
    if not amp:
        return "fp32"
    return "amp_fp16" if device.type == "cuda" else "amp_bf16"


def autocast(device: torch.device, amp: bool) -> Any:
    if not amp:
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16)
