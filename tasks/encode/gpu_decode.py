"""``--decode gpu``: JPEGs decoded by nvJPEG on the CUDA device, resized, cropped and normalised there.

Threads read the raw bytes ahead (file and shard reads: I/O); each batch's JPEGs are decoded in one batched
``torchvision.io.decode_jpeg(..., device="cuda")`` call, then every image goes through the model's preprocessing as
tensor operations on the device (:class:`DeviceTransform`: the standard Resize -> CenterCrop -> ToTensor ->
Normalize chain, resized in float and rounded back to 8-bit levels as PIL does). Images nvJPEG cannot take (PNG,
WebP, generated images, CMYK JPEGs) are decoded by PIL and then take the same device path.

The pixels differ slightly from PIL's (another IDCT, torch's bicubic kernel is not PIL's), so vectors differ: the
decode mode is part of the image entry's cache key and of the experiment (``options: {"decode": "gpu"}``), and the
default ``cpu`` keeps every existing key. benchmarks/input_pipeline.py measures the difference where a GPU is
present; none was here (see docs/input_pipeline.md).
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.encode.batches import ImageBatch, batch_ranges, default_workers
from clipcache.tasks.encode.preprocess import (
    CenterCrop,
    ConvertMode,
    Normalize,
    Resize,
    ToFloatArray,
    lower,
    resized_size,
)

_MODES = {3: "bicubic", 2: "bilinear", 0: "nearest"}  # PIL filter -> torch interpolate mode
_JPEG = b"\xff\xd8"


def check_gpu_decoding(device: str) -> None:
    """``--decode gpu`` needs a CUDA device to decode on: refused in one line, before any work, where there is none."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("decode: --decode gpu decodes JPEGs with nvJPEG on a CUDA device, and torch sees no CUDA "
                          "device on this machine; use --decode cpu (the default)")
    if device != "auto" and not device.startswith("cuda"):
        raise ConfigError(f"decode: --decode gpu decodes on the model's CUDA device, but --device is {device!r}; "
                          f"use --device cuda (or auto), or --decode cpu")


@dataclass(frozen=True)
class DeviceTransform:
    resize: Resize
    crop: CenterCrop | None
    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def of(cls, model: Any, device: torch.device) -> DeviceTransform:
        """The model's preprocessing as device operations; ConfigError when it is not the standard chain."""
        own = model.portable_image_transform()
        lowered = lower(own) if own is not None else None
        steps = [s for s in lowered.steps if not (isinstance(s, ConvertMode) and s.mode == "RGB")] if lowered else []
        kinds = [type(s) for s in steps]
        if kinds not in ([Resize, CenterCrop, ToFloatArray, Normalize], [Resize, ToFloatArray, Normalize]) or \
                steps[0].resample not in _MODES:
            raise ConfigError(f"decode: --decode gpu runs the standard CLIP preprocessing (Resize, CenterCrop, "
                              f"ToTensor, Normalize) on the device; this model's is {own!r}: use --decode cpu")
        normalize = steps[-1]
        return cls(steps[0], steps[1] if kinds[1] is CenterCrop else None,
                   torch.tensor(normalize.mean, dtype=torch.float32, device=device).view(-1, 1, 1),
                   torch.tensor(normalize.std, dtype=torch.float32, device=device).view(-1, 1, 1))

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        """(3, H, W) uint8 on the device -> (3, h, w) float32, normalised."""
        x = image.float()
        height, width = x.shape[-2:]
        new = resized_size(int(height), int(width), self.resize.size, self.resize.max_size)
        if new != (height, width):
            mode = _MODES[self.resize.resample]
            x = F.interpolate(x[None], size=new, mode=mode, antialias=mode != "nearest",
                              **({} if mode == "nearest" else {"align_corners": False}))[0]
            x = x.round_().clamp_(0, 255)  # PIL resizes 8-bit images to 8-bit levels
        if self.crop is not None:
            x = _center_crop(x, self.crop.height, self.crop.width)
        return (x / 255 - self.mean) / self.std


def _center_crop(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    height, width = x.shape[-2:]
    if w > width or h > height:  # torchvision pads with 0 first
        left, top = (w - width) // 2 if w > width else 0, (h - height) // 2 if h > height else 0
        right, bottom = (w - width + 1) // 2 if w > width else 0, (h - height + 1) // 2 if h > height else 0
        x = F.pad(x, (left, right, top, bottom), value=0.0)
        height, width = x.shape[-2:]
    top, left = int(round((height - h) / 2.0)), int(round((width - w) / 2.0))
    return x[:, top:top + h, left:left + w]


def _decode_jpegs(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """nvJPEG in one batched call; when one file fails the whole call does, so then one by one (None: not
    decodable here, PIL tries)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not data:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=DeprecationWarning)  # torchvision 0.29 points to TorchCodec each call
        warnings.simplefilter("ignore", category=UserWarning)
        try:
            return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            out: list[torch.Tensor | None] = []
            for one in data:
                try:
                    out.append(decode_jpeg(one, mode=ImageReadMode.RGB, device=device))
                except RuntimeError:
                    out.append(None)
            return out


def _check_nvjpeg(device: torch.device) -> None:
    """One tiny JPEG through nvJPEG first: a torchvision built without it must not fall back to PIL image by image
    (the vectors would then be another mix of decoders under the same key)."""
    import io

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 90)).save(buffer, format="JPEG")
    if _decode_jpegs([torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)], device) == [None]:
        raise ConfigError(f"decode: this torchvision cannot decode JPEGs on {device} (no nvJPEG); use --decode cpu")


def _read(dataset: EvalDataset, lo: int, hi: int) -> list[tuple[int, Any, str | None]]:
    items: list[tuple[int, Any, str | None]] = []
    for index in range(lo, hi):
        try:
            items.append((index, dataset.read_image_bytes(index), None))
        except DatasetError as e:
            items.append((index, None, str(e)))
    return items


def decode_batch(dataset: EvalDataset, items: list[tuple[int, Any, str | None]], transform: DeviceTransform,
                 device: torch.device) -> ImageBatch:
    jpegs = [k for k, (_, raw, _) in enumerate(items) if isinstance(raw, bytes) and raw[:2] == _JPEG]
    decoded = dict(zip(jpegs, _decode_jpegs([torch.frombuffer(bytearray(items[k][1]), dtype=torch.uint8)
                                              for k in jpegs], device), strict=True))
    done: list[tuple[int, torch.Tensor]] = []
    errors: list[tuple[int, str]] = []
    for k, (index, raw, error) in enumerate(items):
        if error is not None:
            errors.append((index, error))
            continue
        image = decoded.get(k)
        if image is None:  # not a JPEG, or one nvJPEG refused: PIL decodes it, the device does the rest
            try:
                pil = raw.convert("RGB") if isinstance(raw, Image.Image) else dataset.load_image(index)
            except DatasetError as e:
                errors.append((index, str(e)))
                continue
            image = torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1).to(device, non_blocking=True)
        done.append((index, transform(image)))
    pixels = torch.stack([t for _, t in done]) if done else None
    return ImageBatch(np.array([i for i, _ in done], dtype=np.int64), pixels, errors)


def gpu_batches(dataset: EvalDataset, model: Any, start: int, batch_size: int, num_workers: int | None, *,
                device: torch.device, stop: int | None = None) -> Generator[ImageBatch, None, None]:
    """Batches decoded and preprocessed on ``device``, in dataset order (threads read the bytes ahead)."""
    transform = DeviceTransform.of(model, device)
    if device.type == "cuda":
        _check_nvjpeg(device)
    end = len(dataset) if stop is None else min(stop, len(dataset))
    ranges = iter(batch_ranges(start, end, batch_size))
    workers = max(1, default_workers() if num_workers is None else num_workers)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="clipcache-read")
    try:
        pending = deque(pool.submit(_read, dataset, lo, hi) for lo, hi in islice(ranges, 2 * workers))
        while pending:
            items = pending.popleft().result()
            following = next(ranges, None)
            if following is not None:
                pending.append(pool.submit(_read, dataset, *following))
            yield decode_batch(dataset, items, transform, device)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
