"""One image-decoding worker process (started by tasks/encode/decode_pool.py), and the framing both sides speak.

The worker imports only the standard library, NumPy, PIL and what unpickling a job needs (the dataset's reader
module; the model's own transform when it could not be lowered to PIL + NumPy, tasks/encode/preprocess.py). It never
imports Prefect, torch or the flows. It decodes the batches it is sent into slots of a shared-memory ring that the
parent maps too, and answers with the positions decoded and the bad images' messages: no pixel is pickled.

Messages are pickled tuples with a 4-byte length prefix on a Unix socket pair; the ring's memory file descriptor
travels as SCM_RIGHTS ancillary data with the ring message, once per ring (the pool keeps one ring for every encode
that fits in it). Parent -> worker: ``("ring", ring, nbytes)`` (+ the fd), ``("job", job, payload, shape, dtype,
slots, rows, path, ring, cwd)``, ``("batch", job, seq, slot, lo, hi)``, ``("end", job)``, ``("ping",)``, ``("stop",)``.
Worker -> parent: ``("ready", pid)``, ``("done", job, seq, slot, positions, errors)``, ``("failed", job, seq,
traceback)``, ``("pong", modules)``. End of file on the socket means the other side is gone.
"""

from __future__ import annotations

import array
import os
import pickle
import signal
import socket
import struct
import sys
import traceback
from typing import Any

_HEADER = struct.Struct("!I")
_MAX_FDS = 4


def send(sock: socket.socket, message: tuple[Any, ...], fds: tuple[int, ...] = ()) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    frame = _HEADER.pack(len(data)) + data
    sent = 0
    if fds:  # the descriptors ride on the frame's first bytes
        sent = sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    sock.sendall(frame[sent:])


def recv(sock: socket.socket) -> tuple[tuple[Any, ...], list[int]]:
    """The next message and the descriptors sent with it; EOFError when the other side has gone."""
    fds: list[int] = []
    header = b""
    while len(header) < _HEADER.size:
        data, ancillary, _, _ = sock.recvmsg(_HEADER.size - len(header), socket.CMSG_SPACE(_MAX_FDS * 4))
        if not data:
            raise EOFError("the other side closed the connection")
        header += data
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", payload[: len(payload) - len(payload) % 4]).tolist()
    (size,) = _HEADER.unpack(header)
    body = bytearray(size)
    view, got = memoryview(body), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError("the other side closed the connection mid-message")
        got += n
    # trusted: the only peer is the parent process, over a socketpair it made and passed to this process alone; the
    # payload is the dataset index and transform it built itself (no data or model file is unpickled here)
    return pickle.loads(body), fds


def _map(fd: int, nbytes: int) -> Any:
    import mmap

    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


class _Job:
    """A dataset, a transform and the slots of one encode, laid over the pool's ring."""

    def __init__(self, payload: bytes, shape: tuple[int, ...], dtype: str, slots: int, rows: int, memory: Any):
        import numpy as np

        self.dataset, self.transform = pickle.loads(payload)
        self.shape = tuple(shape)
        self.ring = np.ndarray((slots, rows, *self.shape), dtype=dtype, buffer=memory)

    def decode(self, slot: int, lo: int, hi: int) -> tuple[list[int], list[tuple[int, str]]]:
        import numpy as np

        from clipcache.storage.errors import DatasetError

        done: list[int] = []
        errors: list[tuple[int, str]] = []
        for index in range(lo, hi):
            try:
                pixels = self.transform(self.dataset.load_image(index))
            except DatasetError as e:  # the parent decides: one clear line, or skip (--on_bad_image)
                errors.append((index, str(e)))
                continue
            values = np.asarray(pixels)
            if values.shape != self.shape:
                raise ValueError(f"the model's preprocessing made {self.dataset.describe(index)} "
                                 f"{tuple(values.shape)}, not {self.shape} like the first image: one batch needs "
                                 f"one size")
            self.ring[slot, len(done)] = values
            done.append(index)
        return done, errors

    def close(self) -> None:
        del self.ring  # the ring stays mapped for the next encode


def main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us
    sock = socket.socket(fileno=fd)
    import numpy  # noqa: F401  (imported before "ready": the parent's first batch does not wait for it)
    from PIL import Image  # noqa: F401

    jobs: dict[int, _Job] = {}
    rings: dict[int, Any] = {}  # the pool's ring (the latest only: a larger one replaces it between encodes)
    try:
        send(sock, ("ready", os.getpid()))
        while True:
            try:
                message, fds = recv(sock)
            except (EOFError, OSError):
                return  # the parent has gone (or closed us): nothing to clean up but memory
            kind = message[0]
            if kind == "stop":
                return
            if kind == "ping":
                send(sock, ("pong", sorted({name.partition(".")[0] for name in sys.modules})))
            elif kind == "ring":
                rings.clear()  # the previous mapping goes once no job views it
                rings[message[1]] = _map(fds[0], message[2])
            elif kind == "end":
                job = jobs.pop(message[1], None)
                if job is not None:
                    job.close()
            elif kind in ("job", "batch"):
                _, job_id, *rest = message
                try:
                    if kind == "job":
                        payload, shape, dtype, slots, rows, path, ring, cwd = rest
                        sys.path.extend(p for p in path if p not in sys.path)
                        os.chdir(cwd)
                        jobs[job_id] = _Job(payload, shape, dtype, slots, rows, rings[ring])
                        continue
                    seq, slot, lo, hi = rest
                    done, errors = jobs[job_id].decode(slot, lo, hi)
                    send(sock, ("done", job_id, seq, slot, done, errors))
                except Exception as e:  # a bug, or a transform that cannot run here: the parent raises it
                    send(sock, ("failed", job_id, rest[0] if kind == "batch" else -1,
                                "".join(traceback.format_exception(e)).rstrip()))
    except (BrokenPipeError, ConnectionResetError):
        return  # the parent went away while we answered


if __name__ == "__main__":
    main(int(sys.argv[1]))
