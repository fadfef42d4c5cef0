"""Image decoding in worker processes, ahead of the model, in dataset order.

Threads decode under one GIL: issue #30 measured 1 -> 2 decoding threads at ~1.8x, i.e. about a tenth of the
per-image work (PIL object set-up, Python per image) serialised, which caps a thread pool near nine cores' worth.
Here each worker is a process of its own:

- **Started cheaply and safely.** Workers are fresh interpreters (``subprocess`` with an inherited socket, i.e.
  spawn semantics: never ``fork`` of a process that runs Prefect's or torch's threads). They do not go through
  ``multiprocessing``, whose spawn and forkserver children re-import the parent's ``__main__``, which under a
  deployment is ``prefect.engine``: a worker imports only tasks/encode/decode_worker.py, NumPy, PIL and what unpickling
  its job needs (~0.3 s for the standard CLIP preprocessing, which tasks/encode/preprocess.py lowers to PIL + NumPy).
  One pool serves every encode of the process, so the start is paid once.
- **No pixel is pickled.** A job sends each worker the pickled dataset index and transform once; batches are decoded
  into slots of one shared-memory ring (a ``memfd``: no /dev/shm size limit, nothing left behind if the parent is
  killed) and the parent reads them in place. The ring belongs to the pool, not to the encode: it is allocated (and,
  with CUDA, page-locked with ``cudaHostRegister`` so copies to the device are asynchronous with no staging copy)
  once per process, and only again when a later encode needs more room than it has.
- **In order, bounded.** Batches are dispatched in dataset order, at most ``prefetch`` per worker (torch's DataLoader
  keeps ``prefetch_factor`` = 2), into free slots; the parent yields them in order. A slot returns to the pool when the
  consumer asks for the next batch, or, when it said so (:meth:`ImageBatch.release_after`), once the device has
  finished copying it.
- **Failures are one line.** A worker that dies (OOM killer, SIGKILL) is seen at once (its socket closes) and the
  encode fails with :class:`DecodeWorkerError` naming the worker, how it ended and the images it held; committed
  rows stay committed, so a rerun resumes. Ctrl-C reaches the parent, which kills the workers; workers ignore SIGINT
  and exit when the parent's end of the socket closes, whatever killed it.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import mmap
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from clipcache.storage.errors import ClipcacheError
from clipcache.tasks.encode.batches import ImageBatch
from clipcache.tasks.encode.decode_worker import recv, send

if TYPE_CHECKING:
    from clipcache.tasks.datasets.base import EvalDataset

log = logging.getLogger("clipcache.encode")

PREFETCH = 2  # default batches in flight per worker (torch DataLoader's prefetch_factor)
RING_MIN_BYTES = 2 * 2**30  # the ring may always take this much (64 x 224 px float32: 38.5 MB a batch) ...
RING_MEMORY_SHARE = 8  # ... or an eighth of the machine's memory, whichever is more (at least a slot per worker + 2)
_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
         "from clipcache.tasks.encode.decode_worker import main; main(int(sys.argv[2]))")
_job_ids = itertools.count(1)


class DecodeWorkerError(ClipcacheError):
    """An image-decoding worker process died or could not run its job."""


def processes_supported() -> bool:
    """Worker processes need an anonymous shared-memory file (Linux ``memfd_create``); elsewhere threads decode."""
    return hasattr(os, "memfd_create") and hasattr(socket, "AF_UNIX") and bool(sys.executable)


@dataclass
class _Worker:
    number: int
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    held: dict[int, tuple[int, int]]  # seq -> (lo, hi) of the batches sent, not yet answered


def ring_budget() -> int:
    """Bytes the ring may take: an eighth of the machine's memory, at least RING_MIN_BYTES."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = 0
    return max(RING_MIN_BYTES, memory // RING_MEMORY_SHARE)


def ring_slots(workers: int, prefetch: int, slot_bytes: int, budget: int) -> int:
    """``prefetch`` batches per worker + the batch being encoded + one the device may still be copying, within
    ``budget`` bytes; never fewer than one per worker + 2."""
    return max(workers + 2, min(prefetch * workers + 2, budget // max(1, slot_bytes)))


@dataclass
class _Ring:
    """The pool's shared memory: mapped by every worker, reused by every encode that fits in it."""

    number: int
    memory: mmap.mmap
    nbytes: int
    pinned: bool = False

    def view(self, slots: int, rows: int, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ndarray((slots, rows, *shape), dtype=dtype, buffer=self.memory))

    def pin(self) -> None:
        if not self.pinned:
            self.pinned = _pin(torch.frombuffer(self.memory, dtype=torch.uint8))

    def unpin(self) -> None:
        if self.pinned:
            self.pinned = False
            _unpin(torch.frombuffer(self.memory, dtype=torch.uint8))


@dataclass
class PoolStats:
    """What the pool did in this process (tests and benchmarks read it)."""

    rings: int = 0  # shared-memory rings allocated
    pins: int = 0  # rings page-locked (cudaHostRegister)
    max_in_flight: int = 0  # batches sent and not yet answered, at most, over the last encode
    max_per_worker: int = 0  # of them held by one worker, at most


class DecodePool:
    """``size`` decoding processes; one job (one encode) at a time."""

    def __init__(self, size: int):
        self.size = size
        self.broken = False
        self.in_use = False
        self.stats = PoolStats()
        self._ring: _Ring | None = None
        self._selector = selectors.DefaultSelector()
        self.workers = [self._start(n) for n in range(size)]

    def _start(self, number: int) -> _Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # A worker that falls back to torch (a model's own transform) must not start a thread per core.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        try:
            proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path), str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, env=env)
        finally:
            theirs.close()
        self._selector.register(ours, selectors.EVENT_READ, number)
        return _Worker(number, proc, ours, {})

    # -- one encode -------------------------------------------------------------------------------------------------
    def batches(self, dataset: EvalDataset, payload: bytes, ranges: list[tuple[int, int]],
                item: tuple[tuple[int, ...], np.dtype], *, pin_memory: bool = False,
                prefetch: int = PREFETCH) -> Iterator[ImageBatch]:
        """Decoded batches of ``ranges`` in order, at most ``prefetch`` per worker in flight. ``payload`` is
        ``pickle.dumps((dataset, transform))``; ``item`` the shape and dtype of one transformed image."""
        shape, dtype = item
        prefetch = max(1, prefetch)
        rows = max(hi - lo for lo, hi in ranges)
        slot_bytes = rows * int(np.prod(shape)) * dtype.itemsize
        slots = ring_slots(self.size, prefetch, slot_bytes, ring_budget())
        job = next(_job_ids)
        try:
            ring = self._ring_for(slots * slot_bytes, dataset)
            if pin_memory and not ring.pinned:
                ring.pin()
                self.stats.pins += ring.pinned
            for worker in self.workers:
                # the parent's import path now (a plugin or reader imported since the pool started may have added
                # to it), so the worker can unpickle what the job names; and its working directory now, against
                # which a dataset's relative paths resolve (the pool outlives a chdir of the process)
                self._send(worker, ("job", job, payload, shape, dtype.str, slots, rows, list(sys.path), ring.number,
                                    os.getcwd()), (), dataset, None)
            yield from self._run(job, dataset, ranges, ring.view(slots, rows, shape, dtype), prefetch)
            for worker in self.workers:
                self._send(worker, ("end", job), (), dataset, None)
        except BaseException:
            self.broken = True  # workers hold batches of this job (or died): never reuse them
            raise

    def _ring_for(self, nbytes: int, dataset: EvalDataset) -> _Ring:
        """The pool's ring, allocated (and mapped by every worker) only when there is none or it is too small."""
        if self._ring is not None and self._ring.nbytes >= nbytes:
            return self._ring
        self._release_ring()  # no device copy reads it: each encode waits for its copies before it ends
        fd = os.memfd_create("clipcache-decode", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            ring = _Ring(self.stats.rings + 1, mmap.mmap(fd, nbytes), nbytes)
            for worker in self.workers:
                self._send(worker, ("ring", ring.number, nbytes), (fd,), dataset, None)
        finally:
            os.close(fd)
        self._ring = ring
        self.stats.rings += 1
        return ring

    def _release_ring(self) -> None:
        if self._ring is not None:
            try:
                self._ring.unpin()
            except (RuntimeError, AttributeError) as e:  # CUDA already torn down (the process is ending)
                log.debug("decode ring not unpinned: %s", e)
            self._ring = None  # unmapped once no batch views it

    def _run(self, job: int, dataset: EvalDataset, ranges: list[tuple[int, int]], ring: torch.Tensor,
             prefetch: int) -> Iterator[ImageBatch]:
        free: deque[int] = deque(range(len(ring)))
        returning: deque[tuple[int, Any]] = deque()  # (slot, CUDA event or None) given back by the consumer
        answers: dict[int, tuple[int, list[int], list[tuple[int, str]]]] = {}
        sent = answered = 0
        self.stats.max_in_flight = self.stats.max_per_worker = 0
        try:
            while answered < len(ranges):
                _reclaim(returning, free, wait=False)
                while sent < len(ranges) and free:
                    worker = min(self.workers, key=lambda w: len(w.held))
                    if len(worker.held) >= prefetch:
                        break
                    slot = free.popleft()
                    lo, hi = ranges[sent]
                    worker.held[sent] = (lo, hi)
                    self._send(worker, ("batch", job, sent, slot, lo, hi), (), dataset, (lo, hi))
                    sent += 1
                    self.stats.max_per_worker = max(self.stats.max_per_worker, len(worker.held))
                    self.stats.max_in_flight = max(self.stats.max_in_flight, sum(len(w.held) for w in self.workers))
                if answered in answers:
                    slot, positions, errors = answers.pop(answered)
                    batch = ImageBatch(np.asarray(positions, dtype=np.int64),
                                       ring[slot, : len(positions)] if positions else None, errors)
                    yield batch
                    returning.append((slot, batch.release_event))
                    answered += 1
                elif answered == sent:  # the next batch waits for a slot the device is still reading
                    _reclaim(returning, free, wait=True)
                else:
                    self._receive(job, answers, dataset)
        finally:
            while returning:  # every device copy from the ring has finished before the next encode reuses it
                _reclaim(returning, free, wait=True)

    def _send(self, worker: _Worker, message: tuple[Any, ...], fds: tuple[int, ...], dataset: EvalDataset,
              images: tuple[int, int] | None) -> None:
        try:
            send(worker.sock, message, fds)
        except OSError as e:
            raise self._died(worker, dataset, images) from e

    def _receive(self, job: int, answers: dict[int, tuple[int, list[int], list[tuple[int, str]]]],
                 dataset: EvalDataset) -> None:
        for key, _ in self._selector.select():
            worker = self.workers[key.data]
            try:
                message, _ = recv(worker.sock)
            except (EOFError, OSError) as e:
                held = [worker.held[seq] for seq in sorted(worker.held)]  # it decodes them in order: the first
                raise self._died(worker, dataset, held[0] if held else None) from e
            kind = message[0]
            if kind == "done" and message[1] == job:
                _, _, seq, slot, positions, errors = message
                worker.held.pop(seq, None)
                answers[seq] = (slot, positions, errors)
            elif kind == "failed":
                lo, hi = worker.held.get(message[2], (None, None))
                where = f" while decoding {dataset.describe(lo)}" if lo is not None else ""
                raise RuntimeError(f"image decoding worker {worker.number} failed{where} "
                                   f"(images {lo}..{hi}):\n{message[3]}")

    def _died(self, worker: _Worker, dataset: EvalDataset, images: tuple[int, int] | None) -> DecodeWorkerError:
        try:
            code = worker.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            how = "closed its connection"
        elif code < 0:
            name = signal.Signals(-code).name
            how = f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            how = f"exited with code {code}"
        what = f" while decoding images {images[0]}..{images[1] - 1} of {dataset.name}" if images else ""
        return DecodeWorkerError(f"image decoding worker {worker.number} (pid {worker.proc.pid}) {how}{what}; "
                                 f"rows encoded so far are kept: rerun to resume")

    def ping(self) -> list[list[str]]:
        """The top-level modules each worker has imported (what a worker costs to start)."""
        out = []
        for worker in self.workers:
            send(worker.sock, ("ping",))
            while (message := recv(worker.sock)[0])[0] != "pong":
                pass
            out.append(message[1])
        return out

    def alive(self) -> bool:
        return not self.broken and all(w.proc.poll() is None for w in self.workers)

    def close(self) -> None:
        """Stop every worker: asked to, or killed when the pool is broken (they may be mid-batch)."""
        for worker in self.workers:
            if not self.broken:
                try:
                    send(worker.sock, ("stop",))
                except OSError:
                    pass
            self._selector.unregister(worker.sock)
            worker.sock.close()  # a worker also stops at end of file
        for worker in self.workers:
            try:
                worker.proc.wait(timeout=0 if self.broken else 5)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
        self._selector.close()
        self._release_ring()


def _reclaim(returning: deque[tuple[int, Any]], free: deque[int], wait: bool) -> None:
    """Give back the slots the consumer is done with; ``wait``: at least the oldest, waiting for its device copy."""
    while returning:
        slot, event = returning[0]
        if event is not None and not event.query():
            if not wait:
                return
            event.synchronize()
        free.append(returning.popleft()[0])
        wait = False


def _pin(ring: torch.Tensor) -> bool:
    """Page-lock the ring for asynchronous host-to-device copies (CUDA only; best effort)."""
    try:
        status = torch.cuda.cudart().cudaHostRegister(ring.data_ptr(), ring.numel() * ring.element_size(), 0)
    except (RuntimeError, AttributeError, AssertionError) as e:
        log.debug("decode ring not pinned (%s): host-to-device copies will wait", e)
        return False
    return int(status) == 0


def _unpin(ring: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(ring.data_ptr())


# -- the process's pool ---------------------------------------------------------------------------------------------
_shared: DecodePool | None = None
_shared_lock = threading.Lock()


def acquire_pool(size: int) -> DecodePool | None:
    """The process's pool of ``size`` workers for one encode, started if needed; None while another encode of this
    process holds it (that one decodes in threads)."""
    global _shared
    with _shared_lock:
        if _shared is not None and _shared.in_use:
            return None
        if _shared is not None and (_shared.size != size or not _shared.alive()):
            _shared.close()
            _shared = None
        if _shared is None:
            _shared = DecodePool(size)
        _shared.in_use = True
        return _shared


def release_pool(pool: DecodePool) -> None:
    global _shared
    with _shared_lock:
        pool.in_use = False
        if pool.broken:
            pool.close()
            if _shared is pool:
                _shared = None


def pool_running(size: int) -> bool:
    with _shared_lock:
        return _shared is not None and _shared.size == size and not _shared.in_use and _shared.alive()


@atexit.register
def shutdown_pool() -> None:
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.broken = True  # the process is ending (maybe Ctrl-C): kill, do not wait for batches in flight
            _shared.close()
            _shared = None
