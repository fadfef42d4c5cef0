"""``--decode gpu``: JPEGs decoded by nvJPEG on the CUDA device, resized, cropped and normalised there, a batch ahead
of the model.

- **Read ahead on threads.** ``num_workers`` reader threads read each batch's raw bytes (file and shard reads: I/O),
  ``prefetch`` batches per thread ahead, and look at each JPEG's header (tasks/encode/jpeg_header.py). A JPEG whose
  declared size is over PIL's decompression-bomb bound is refused there, as the CPU path refuses it
  (tasks/datasets/image_bytes.py), before nvJPEG sees a byte. Images nvJPEG's batched decode does not take are
  decoded by PIL right there, in the reader threads, one by one, and counted (:class:`DecodeCounts`): not a JPEG
  (PNG, WebP, generated images), greyscale and CMYK/YCCK JPEGs, and the rare lossless, arithmetic-coded or 12-bit
  ones. They then take the same device path as the rest.
- **Batched on the device.** One decoding thread decodes each batch's JPEGs in one batched
  ``torchvision.io.decode_jpeg(..., device="cuda")`` call (nvJPEG; a call blocks its thread until the batch is
  decoded, so it is not the encoding thread's), and preprocesses the batch as tensor operations
  (:class:`DeviceTransform`: the standard Resize -> CenterCrop -> ToTensor -> Normalize chain, resized in float and
  rounded back to 8-bit levels as PIL does), one call per group of images of one size rather than one per image.
- **Overlapped with the model.** That thread works on a CUDA stream of its own, so batch i+1 is decoded and resized
  while the encoding thread's stream runs batch i's forward pass; each batch carries an event that the consumer's
  stream waits for before it reads the pixels (and the pixels' memory is recorded as used by that stream).

The pixels differ slightly from PIL's (another IDCT, torch's bicubic kernel is not PIL's), so vectors differ: the
decode mode is part of the image entry's cache key and of the experiment (``options: {"decode": "gpu"}``), and the
default ``cpu`` keeps every existing key. benchmarks/input_pipeline.py measures the difference where a GPU is
present; none was here (see docs/input_pipeline.md).
"""

from __future__ import annotations

import logging
import queue
import threading
import warnings
from collections import deque
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, fields
from itertools import islice
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.datasets.image_bytes import check_image_size
from clipcache.tasks.encode.batches import ImageBatch, batch_ranges, default_workers
from clipcache.tasks.encode.jpeg_header import jpeg_header
from clipcache.tasks.encode.preprocess import (
    CenterCrop,
    ConvertMode,
    Normalize,
    Resize,
    ToFloatArray,
    lower,
    resized_size,
)

log = logging.getLogger("clipcache.encode")

_MODES = {3: "bicubic", 2: "bilinear", 0: "nearest"}  # PIL filter -> torch interpolate mode
_GROUP_ELEMENTS = 2**28  # float32 elements resized in one call at most (1 GiB): a batch of huge photos is split


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
        """(3, H, W) uint8 on the device -> (3, h, w) float32, normalised (one image: the reference for ``batch``)."""
        return self._normalise(self._resize_crop(image.float()[None]))[0]

    def batch(self, images: list[torch.Tensor]) -> torch.Tensor:
        """(3, H_i, W_i) uint8 images on the device -> (n, 3, h, w) float32, normalised. Images of one size are resized
        in one call; each output pixel is computed as for the image alone (the same kernel, the same weights), so the
        result is ``torch.stack([self(i) for i in images])`` to the bit (tests/test_gpu_decode.py)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for k, image in enumerate(images):
            groups.setdefault((int(image.shape[-2]), int(image.shape[-1])), []).append(k)
        out: torch.Tensor | None = None
        for (height, width), members in groups.items():
            step = max(1, _GROUP_ELEMENTS // (3 * height * width))
            for lo in range(0, len(members), step):
                chunk = members[lo:lo + step]
                done = self._resize_crop(torch.stack([images[k] for k in chunk]).float())
                if len(chunk) == len(images):  # one size, one call (a folder of same-size photos): in place
                    return self._normalise(done)
                if out is None:
                    out = done.new_empty((len(images), *done.shape[1:]))
                out[torch.tensor(chunk, device=done.device)] = done
        if out is None:
            raise ValueError("no image to preprocess")
        return self._normalise(out)

    def _resize_crop(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        new = resized_size(int(height), int(width), self.resize.size, self.resize.max_size)
        if new != (height, width):
            mode = _MODES[self.resize.resample]
            x = F.interpolate(x, size=new, mode=mode, antialias=mode != "nearest",
                              **({} if mode == "nearest" else {"align_corners": False}))
            x = x.round_().clamp_(0, 255)  # PIL resizes 8-bit images to 8-bit levels
        if self.crop is not None:
            x = _center_crop(x, self.crop.height, self.crop.width)
        return x

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        return (x / 255 - self.mean) / self.std


def _center_crop(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """torchvision's CenterCrop of the last two dimensions (padding with 0 first where the image is smaller)."""
    height, width = x.shape[-2:]
    if w > width or h > height:
        left, top = (w - width) // 2 if w > width else 0, (h - height) // 2 if h > height else 0
        right, bottom = (w - width + 1) // 2 if w > width else 0, (h - height + 1) // 2 if h > height else 0
        x = F.pad(x, (left, right, top, bottom), value=0.0)
        height, width = x.shape[-2:]
    top, left = int(round((height - h) / 2.0)), int(round((width - w) / 2.0))
    return x[..., top:top + h, left:left + w]


@dataclass
class DecodeCounts:
    """Images by who decoded them: nvJPEG, or PIL and why (counted over one encode)."""

    nvjpeg: int = 0
    not_jpeg: int = 0  # PNG, WebP, ... or images a reader builds (generated data)
    greyscale: int = 0
    cmyk: int = 0
    other: int = 0  # lossless, arithmetic-coded or 12-bit JPEGs
    refused: int = 0  # JPEGs nvJPEG failed on (PIL then decodes them, or names what is wrong)

    def add(self, route: str) -> None:
        setattr(self, route, getattr(self, route) + 1)

    @property
    def by_pil(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self)) - self.nvjpeg

    def describe(self) -> str:
        why = ", ".join(f"{getattr(self, f.name)} {f.name.replace('_', ' ')}" for f in fields(self)
                        if f.name != "nvjpeg" and getattr(self, f.name))
        return f"{self.nvjpeg} images decoded by nvJPEG, {self.by_pil} by PIL" + (f" ({why})" if why else "")


@dataclass
class _Read:
    """One image as a reader thread leaves it: JPEG bytes for nvJPEG, or PIL's pixels, or why it failed."""

    index: int
    route: str
    data: torch.Tensor | None = None  # the file's bytes (nvjpeg)
    pixels: np.ndarray | None = None  # (H, W, 3) uint8 decoded by PIL
    error: str | None = None


def read_batch(dataset: EvalDataset, lo: int, hi: int) -> list[_Read]:
    """Images ``lo``..``hi - 1`` read (in a reader thread); those nvJPEG does not take are decoded by PIL here."""
    items: list[_Read] = []
    for index in range(lo, hi):
        try:
            raw = dataset.read_image_bytes(index)
            route, size = jpeg_header(raw)
            if route == "nvjpeg" and size is not None:  # nvJPEG has no bound of its own: PIL's, from the header
                check_image_size(size, lambda: dataset.describe(index))  # noqa: B023 (called here, or never)
            if route == "nvjpeg" and isinstance(raw, bytes | bytearray):
                items.append(_Read(index, route, data=torch.frombuffer(bytearray(raw), dtype=torch.uint8)))
            else:
                items.append(_Read(index, route, pixels=_pil_pixels(dataset, index, raw)))
        except DatasetError as e:
            items.append(_Read(index, "error", error=str(e)))
    return items


def _pil_pixels(dataset: EvalDataset, index: int, raw: Any) -> np.ndarray:
    pil = raw.convert("RGB") if isinstance(raw, Image.Image) else dataset.load_image(index)
    return np.array(pil)  # a writable copy


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


def decode_batch(dataset: EvalDataset, items: list[_Read], transform: DeviceTransform, device: torch.device,
                 counts: DecodeCounts) -> ImageBatch:
    """One batch: its JPEGs through nvJPEG in one call, PIL's pixels uploaded, all preprocessed on ``device``."""
    jpegs = [k for k, item in enumerate(items) if item.data is not None]
    decoded = dict(zip(jpegs, _decode_jpegs([items[k].data for k in jpegs], device), strict=True))  # type: ignore
    done: list[tuple[int, torch.Tensor]] = []
    errors: list[tuple[int, str]] = []
    for k, item in enumerate(items):
        if item.error is not None:
            errors.append((item.index, item.error))
            continue
        image, pixels = decoded.get(k), item.pixels
        if item.data is not None and image is None:  # a JPEG nvJPEG refused: PIL decodes it or says what is wrong
            try:
                pixels = np.array(dataset.load_image(item.index))
            except DatasetError as e:
                errors.append((item.index, str(e)))
                continue
            counts.add("refused")
        else:
            counts.add(item.route)
        if image is None:
            image = torch.from_numpy(pixels).permute(2, 0, 1).to(device, non_blocking=True)
        done.append((item.index, image))
    pixels_out = transform.batch([image for _, image in done]) if done else None
    return ImageBatch(np.array([i for i, _ in done], dtype=np.int64), pixels_out, errors)


# -- the pipeline ----------------------------------------------------------------------------------------------------
_END = object()


def gpu_batches(dataset: EvalDataset, model: Any, start: int, batch_size: int, num_workers: int | None, *,
                device: torch.device, stop: int | None = None, prefetch: int = 2,
                counts: DecodeCounts | None = None) -> Generator[ImageBatch, None, None]:
    """Batches decoded and preprocessed on ``device``, in dataset order: ``num_workers`` threads read ahead, one
    thread decodes on a stream of its own, ``prefetch`` batches ahead of the consumer. ``counts``: filled in with
    who decoded what (logged at the end)."""
    transform = DeviceTransform.of(model, device)
    if device.type == "cuda":
        _check_nvjpeg(device)
    counts = counts if counts is not None else DecodeCounts()
    end = len(dataset) if stop is None else min(stop, len(dataset))
    ranges = batch_ranges(start, end, batch_size)
    readers = max(1, default_workers() if num_workers is None else num_workers)
    depth = max(1, prefetch)
    stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(device))  # the transform's constants are on the device
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stopping = threading.Event()
    pool = ThreadPoolExecutor(readers, thread_name_prefix="clipcache-read")

    def hand_over(item: Any) -> bool:
        while not stopping.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def decode_ahead() -> None:
        try:
            pending_ranges = iter(ranges)
            reads = deque(pool.submit(read_batch, dataset, lo, hi) for lo, hi in islice(pending_ranges, depth * readers))
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                while reads and not stopping.is_set():
                    items = reads.popleft().result()
                    following = next(pending_ranges, None)
                    if following is not None:
                        reads.append(pool.submit(read_batch, dataset, *following))
                    batch = decode_batch(dataset, items, transform, device, counts)
                    event = None
                    if stream is not None:
                        event = torch.cuda.Event()
                        event.record(stream)
                    if not hand_over((batch, event)):
                        return
            hand_over(_END)
        except BaseException as e:  # noqa: BLE001 (raised in the consumer's thread)
            hand_over(e)

    decoder = threading.Thread(target=decode_ahead, name="clipcache-gpu-decode", daemon=True)
    decoder.start()
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            batch, event = item
            if event is not None:  # the consumer's stream reads the pixels only once the decoding stream made them
                consumer = torch.cuda.current_stream(device)
                consumer.wait_event(event)
                if batch.pixels is not None:
                    batch.pixels.record_stream(consumer)
            yield batch
        if counts.by_pil:
            log.info("--decode gpu on %s: %s", dataset.name, counts.describe())
    finally:
        stopping.set()
        decoder.join()
        pool.shutdown(wait=True, cancel_futures=True)
