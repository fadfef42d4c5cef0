"""Keep the device busy: copies and cache writes overlap the forward pass instead of following it.

- :class:`DeviceFeeder` (CUDA): the batch's host-to-device copy runs on a copy stream from pinned memory (so the
  next batch's copy overlaps the current forward pass), the forward pass is queued without waiting, and the vectors
  come back by an asynchronous device-to-host copy into pinned memory, finished when a CUDA event says so. On the
  CPU (and for models without ``image_features_and_norms``) it simply calls ``encode_images``.
- :class:`BackgroundWriter`: the cache writer's ``add`` (Zarr chunk writes, commits) runs in one thread behind a
  bounded queue, so storage never stalls the loop that feeds the device. Its error is raised in the encoding thread
  at the next batch or at the end (the same exception: a full disk stays a full disk); rows committed before it
  stay committed, so a rerun resumes.

The vectors are the same bits as ``encode_images``: the same operations in the same order on the same batches;
only when the host waits for them moves. Verified here on the CPU; the CUDA path follows torch's documented stream
and event API and is measured by benchmarks/input_pipeline.py where a GPU is present.
"""

from __future__ import annotations

import queue
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from clipcache.storage.cache_writer import EntryWriter

MAX_WAITING = 4  # batches of vectors between the encoding thread and the writer thread


class PendingVectors:
    """Vectors (and each one's norm before normalisation, when the model gives it) being copied back from the
    device; ``result()`` waits for them (in the writer thread)."""

    def __init__(self, host: torch.Tensor | np.ndarray, event: Any = None, keep: np.ndarray | None = None,
                 norms: torch.Tensor | np.ndarray | None = None, raw: torch.Tensor | np.ndarray | None = None):
        self._host, self._event, self._keep, self._norms, self._raw = host, event, keep, norms, raw

    def result(self) -> np.ndarray:
        return self.result_and_norms()[0]

    def result_and_norms(self) -> tuple[np.ndarray, np.ndarray | None]:
        return self.result_norms_raw()[:2]

    def result_norms_raw(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The vectors, their norms and their raw rows (each None where not asked for or not given)."""
        if self._event is not None:
            self._event.synchronize()
        values = _numpy(self._host)
        norms, raw = (None if v is None else _numpy(v) for v in (self._norms, self._raw))
        if self._keep is None:
            return values, norms, raw
        return values[self._keep], None if norms is None else norms[self._keep], None if raw is None else raw[self._keep]


def _numpy(values: torch.Tensor | np.ndarray) -> np.ndarray:
    return values.numpy() if isinstance(values, torch.Tensor) else values


class DeviceFeeder:
    """``raw``: give each batch's raw rows too (the model's float32 output before normalisation), for entries
    that keep them."""

    def __init__(self, model: Any, device: torch.device, raw: bool = False):
        self.model = model
        self.raw = raw and callable(getattr(model, "encode_images_with_raw", None))
        feature_hook = "image_features_norms_raw" if self.raw else "image_features_and_norms"
        self.overlap = device.type == "cuda" and callable(getattr(model, feature_hook, None))
        self.copy_stream = torch.cuda.Stream(device=device) if self.overlap else None
        self.device = device

    def encode(self, pixels: torch.Tensor, *, keep: np.ndarray | None = None,
               batch: Any = None) -> PendingVectors:
        """Start encoding ``pixels`` (rows ``keep`` of the result are wanted; all when None). ``batch``: the
        ImageBatch they came from, told when its memory may be reused."""
        stream = self.copy_stream
        if stream is None:
            if self.raw:
                vectors, norms, raw = self.model.encode_images_with_raw(pixels)
                return PendingVectors(vectors, keep=keep, norms=norms, raw=None if norms is None else raw)
            with_norms = getattr(self.model, "encode_images_with_norms", None)
            if with_norms is None:  # a model outside the EmbeddingModel hierarchy (a test double)
                return PendingVectors(self.model.encode_images(pixels), keep=keep)
            vectors, norms = with_norms(pixels)
            return PendingVectors(vectors, keep=keep, norms=norms)
        compute = torch.cuda.current_stream(self.device)
        with torch.inference_mode():
            if pixels.device.type != "cuda":
                with torch.cuda.stream(stream):
                    on_device = pixels.to(self.device, non_blocking=True)
                    copied = torch.cuda.Event()
                    copied.record(stream)
                if batch is not None:
                    batch.release_after(copied)  # the pinned slot is free once the copy is done
                compute.wait_event(copied)
                on_device.record_stream(compute)  # its memory belongs to the compute stream's work now
            else:
                on_device = pixels
            if self.raw:
                features, norms, raw = self.model.image_features_norms_raw(on_device)
            else:
                (features, norms), raw = self.model.image_features_and_norms(on_device), None
            host, host_norms = _pinned_copy(features), _pinned_copy(norms)
            host_raw = None if raw is None else _pinned_copy(raw)
            done = torch.cuda.Event()
            done.record(compute)
        return PendingVectors(host, done, keep, norms=host_norms, raw=host_raw)


def _pinned_copy(values: torch.Tensor) -> torch.Tensor:
    """An asynchronous device-to-host copy into pinned memory (complete once the compute stream's event is)."""
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    return host


class BackgroundWriter:
    """``writer.add(vectors, positions, **extra)`` in a thread of its own; use as a context manager."""

    def __init__(self, writer: EntryWriter, depth: int = MAX_WAITING):
        self.writer = writer
        self._queue: queue.Queue[tuple[PendingVectors, np.ndarray, dict[str, np.ndarray]] | None] = \
            queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="clipcache-cache-writer", daemon=True)

    def __enter__(self) -> BackgroundWriter:
        self._thread.start()
        return self

    def add(self, vectors: PendingVectors, positions: np.ndarray, **extra: np.ndarray) -> None:
        while True:
            self._raise_failure()
            try:
                self._queue.put((vectors, positions, extra), timeout=0.2)
                return
            except queue.Full:
                continue  # the writer is busy; look again whether it failed meanwhile

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue  # failed: drain, so the encoding thread never blocks on a full queue
            vectors, positions, extra = item
            try:
                values, norms, raw = vectors.result_norms_raw()
                self.writer.add(values, positions, **extra, **({} if norms is None else {"norms": norms}),
                                **({} if raw is None or norms is None else {"raw": raw}))
            except BaseException as e:  # noqa: B036 (handed to the encoding thread, which raises it)
                self._error = e

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._queue.put(None)  # what is queued is still written: those rows are valid and keep a resume short
        self._thread.join()
        if kind is None:
            self._raise_failure()
