"""Batches of decoded images for the encode stage, in dataset order, from one of three sources:

- ``processes`` (tasks/encode/decode_pool.py): worker processes decode into shared memory; scales with cores;
- ``threads``: a thread pool in this process (PIL and torch release the GIL for most of the work, not all of it:
  about a tenth is serialised, which caps it near nine cores' worth);
- GPU decoding (``--decode gpu``, tasks/encode/gpu_decode.py): threads read bytes, nvJPEG decodes on the device.

Every source batches the same way (``[start, start + batch_size)``, ...) and runs the same decode and the same
transform, so the vectors are bit-identical whichever decodes (``--decode gpu`` excepted: it is another
preprocessing, with an identity of its own).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.tasks.contract import DecodePoolKind, EncodeSettings
from clipcache.tasks.datasets.base import EvalDataset

if TYPE_CHECKING:
    from clipcache.tasks.encode.decode_pool import DecodePool
    from clipcache.tasks.models.base import EmbeddingModel

log = logging.getLogger("clipcache.encode")

# ``auto``: worker processes from this many images to decode (or when this process already runs a pool): below it,
# starting the workers (~0.3-1 s, seconds under load) costs more than threads lose.
PROCESS_MIN_IMAGES = 4096
MAX_PAYLOAD_BYTES = 256 * 2**20  # images held in memory (ArrayImages) decode in threads rather than be copied N times


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class ImageBatch:
    indices: np.ndarray  # dataset positions of the decoded images, in order
    pixels: torch.Tensor | None
    errors: list[tuple[int, str]]
    # What must finish before ``pixels``' memory may be reused (a CUDA event after an asynchronous copy); None: the
    # memory is free as soon as the consumer asks for the next batch.
    release_event: Any = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.indices) + len(self.errors)

    def release_after(self, event: Any) -> None:
        self.release_event = event


def load_item(dataset: EvalDataset, transform: Any, index: int) -> tuple[int, torch.Tensor | None, str | None]:
    """Decode and transform one image; a bad image is reported back, not raised, so the caller decides (error or
    skip) and the message names the file instead of being buried in a worker traceback."""
    try:
        return index, transform(dataset.load_image(index)), None
    except DatasetError as e:
        return index, None, str(e)


def collate(items: list[tuple[int, torch.Tensor | None, str | None]], pin_memory: bool = False) -> ImageBatch:
    ok = [(i, t) for i, t, err in items if t is not None]
    errors = [(i, err) for i, _, err in items if err is not None]
    indices = np.array([i for i, _ in ok], dtype=np.int64)
    pixels = torch.stack([torch.as_tensor(t) for _, t in ok]) if ok else None
    if pixels is not None and pin_memory:
        pixels = pixels.pin_memory()  # here, in a decoding thread, not in the loop that feeds the device
    return ImageBatch(indices, pixels, errors)


def batch_ranges(start: int, end: int, batch_size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + batch_size, end)) for lo in range(start, end, batch_size)]


def thread_batches(dataset: EvalDataset, transform: Any, ranges: list[tuple[int, int]], num_workers: int,
                   pin_memory: bool = False, prefetch: int = 2) -> Iterator[ImageBatch]:
    """``num_workers`` threads decode whole batches ahead of the model, ``prefetch`` per thread (0: in the calling
    thread)."""
    def load(batch: tuple[int, int]) -> ImageBatch:
        return collate([load_item(dataset, transform, i) for i in range(*batch)], pin_memory)

    if num_workers <= 0:
        yield from map(load, ranges)
        return
    pending_ranges = iter(ranges)
    pool = ThreadPoolExecutor(num_workers, thread_name_prefix="clipcache-decode")
    try:
        pending = deque(pool.submit(load, b) for b in islice(pending_ranges, max(1, prefetch) * num_workers))
        while pending:
            batch = pending.popleft().result()
            following = next(pending_ranges, None)
            if following is not None:
                pending.append(pool.submit(load, following))
            yield batch
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def iter_image_batches(dataset: EvalDataset, transform: Any, start: int, batch_size: int,
                       num_workers: int | None, stop: int | None = None, *, pool: DecodePoolKind = "threads",
                       portable: Any = None, pin_memory: bool = False,
                       prefetch: int = 2) -> Generator[ImageBatch, None, None]:
    """Batches of decoded images from position ``start`` up to ``stop`` (default: the end), in dataset order.

    ``transform`` runs in threads; ``portable`` (tasks/encode/preprocess.py: ``portable_transform``), when given,
    is what worker processes run instead; without it, or when the dataset cannot be sent to a process, threads
    decode. ``num_workers``: decoding threads or processes (None: the cores available; 0: in this thread);
    ``prefetch``: batches each of them decodes ahead.

    A batch from worker processes views shared memory that is reused once the next batch is asked for (or after
    its ``release_event``): copy what must outlive that.
    """
    end = len(dataset) if stop is None else min(stop, len(dataset))
    ranges = batch_ranges(start, end, batch_size)
    workers = default_workers() if num_workers is None else num_workers
    if choose_pool(pool, end - start, workers) == "processes":
        from clipcache.tasks.encode.decode_pool import acquire_pool, release_pool

        decoders = acquire_pool(workers)  # None while another encode of this process holds it
        if decoders is not None:
            try:
                batches = process_batches(decoders, dataset, portable, ranges, pin_memory, prefetch)
                if batches is not None:
                    yield from batches
                    return
            finally:
                release_pool(decoders)
        if pool == "processes":
            log.warning("decoding %s in threads: %s", dataset.name, "its images or the model's preprocessing "
                        "cannot be sent to a process" if decoders is not None else "another encode holds the pool")
    yield from thread_batches(dataset, transform, ranges, workers, pin_memory, prefetch)


def process_batches(decoders: DecodePool, dataset: EvalDataset, portable: Any, ranges: list[tuple[int, int]],
                    pin_memory: bool = False, prefetch: int = 2) -> Iterator[ImageBatch] | None:
    """``ranges`` decoded by the processes of ``decoders``; None when the dataset or ``portable`` (the transform)
    cannot go to a process, or no image of the first batches decodes (then threads report every image)."""
    payload, item = _process_job(dataset, portable, ranges)
    if payload is None or item is None:
        return None
    return decoders.batches(dataset, payload, ranges, item, pin_memory=pin_memory, prefetch=prefetch)


def choose_pool(requested: DecodePoolKind, images: int, workers: int) -> Literal["processes", "threads"]:
    from clipcache.tasks.encode.decode_pool import pool_running, processes_supported

    if workers <= 0 or requested == "threads" or images <= 0 or not processes_supported():
        return "threads"
    if requested == "processes" or images >= PROCESS_MIN_IMAGES or pool_running(workers):
        return "processes"
    return "threads"


def _unimportable(*objects: Any) -> str | None:
    """The first module defining the objects' classes (or their bases) that a fresh interpreter cannot import: a
    script's or notebook's ``__main__``, or a module built in memory (no spec). Pickle names classes by module, so
    a dataset class from there would not unpickle in a worker."""
    for obj in objects:
        for cls in type(obj).__mro__:
            module = sys.modules.get(cls.__module__)
            if cls.__module__ == "__main__" or module is None or getattr(module, "__spec__", None) is None:
                if cls.__module__ != "builtins":
                    return cls.__module__
    return None


def _process_job(dataset: EvalDataset, portable: Any,
                 ranges: list[tuple[int, int]]) -> tuple[bytes | None, tuple[tuple[int, ...], np.dtype] | None]:
    """(the pickled dataset and transform, the shape and dtype of one transformed image), or (None, None) when
    they cannot go to a process. The shape comes from the first image that decodes, here."""
    if portable is None:
        return None, None
    if (where := _unimportable(dataset, portable)) is not None:
        log.info("decoding in threads: %s is defined in %s, which a worker process cannot import",
                 type(dataset).__name__, where)
        return None, None
    try:
        payload = pickle.dumps((dataset, portable), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        log.info("decoding in threads: %s does not pickle (%s)", type(dataset).__name__, e)
        return None, None
    if len(payload) > MAX_PAYLOAD_BYTES:
        log.info("decoding in threads: the index of %s is %d MB", dataset.name, len(payload) >> 20)
        return None, None
    positions = (index for lo, hi in ranges for index in range(lo, hi))
    for index in islice(positions, 256):
        try:
            probe = np.asarray(portable(dataset.load_image(index)))
        except DatasetError:
            continue
        return payload, (tuple(probe.shape), probe.dtype)
    return None, None  # none of the first images decodes: threads report them



def model_batches(model: EmbeddingModel, dataset: EvalDataset, start: int, settings: EncodeSettings, *,
                  device: torch.device, decode: str = "cpu",
                  stop: int | None = None) -> Generator[ImageBatch, None, None]:
    """The batches ``model`` encodes from ``start``: decoded on the CPU (by the workers ``settings`` ask for) or,
    with ``decode="gpu"``, on ``device``."""
    if decode == "gpu":
        from clipcache.tasks.encode.gpu_decode import gpu_batches

        if device.type != "cuda":
            raise ConfigError(f"decode: --decode gpu decodes on a CUDA device; this model runs on {device}")

        return gpu_batches(dataset, model, start, settings.batch_size, settings.num_workers, device=device, stop=stop,
                           prefetch=settings.prefetch)
    from clipcache.tasks.encode.preprocess import portable_transform

    return iter_image_batches(dataset, model.image_transform, start, settings.batch_size, settings.num_workers, stop,
                              pool=settings.decode_pool, portable=portable_transform(model),
                              pin_memory=device.type == "cuda", prefetch=settings.prefetch)
