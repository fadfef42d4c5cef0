"""What an embedding server may make clipcache hold, wait for or print: bounded answers, one deadline per request,
bounded ``Retry-After`` values and redacted server text.

- An answer is read as it arrives, with at most :func:`max_answer_bytes` on the wire and as many once decompressed
  (gzip and deflate are decompressed here, chunk by chunk with a bound, so a gzip bomb cannot expand in one step);
  a declared ``Content-Length`` above the bound is refused before anything is read.
- ``--api_timeout`` is the deadline of the whole request: connecting, sending and the last byte of the answer. Each
  read waits at most the time left, so a server trickling one byte a second runs out of time as a silent one does.
- A ``Retry-After`` longer than :data:`MAX_RETRY_AFTER` (or not a number, or infinite) ends the run in one line
  instead of a wait: the server says to come back later.
- Server text that reaches a message is redacted first: the API key, anything after ``Bearer`` / ``Basic``, a
  password of a URL and ``sk-...``-like tokens become ``***``, so a proxy that echoes the request's headers cannot
  put the key on a terminal, in a log or in Prefect's database.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

MAX_RETRY_AFTER = 600.0  # seconds a server may ask clipcache to wait before it gives up instead
BASE_ANSWER_BYTES = 4 << 20  # an answer's allowance: 4 MiB, plus PER_INPUT_BYTES for each input
PER_INPUT_BYTES = 512 << 10  # a 16,384-dimensional vector as JSON floats is ~400 KB
MAX_SERVER_TEXT = 200  # characters of a server's error text kept in a message (after redaction)


class AnswerTooLarge(Exception):
    pass


class DeadlinePassed(Exception):
    pass


class NotJson(Exception):
    pass


def max_answer_bytes(inputs: int) -> int:
    return BASE_ANSWER_BYTES + PER_INPUT_BYTES * max(1, inputs)


_SECRETS = re.compile(r"(?i)\b(bearer|basic|token|api[-_ ]?key|authorization|x-api-key)(\"?\s*[:=]?\s*\"?)"
                      r"([^\s\"',;}]+)")
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]*:[^/\s@]*@")
_KEY_LIKE = re.compile(r"\b(sk|pk|rk|key|api|tok)[-_][A-Za-z0-9_\-]{8,}")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret in ``secrets`` and anything that looks like a credential replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    text = _SECRETS.sub(lambda m: m.group(1) + m.group(2) + "***", text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + "***@", text)
    return _KEY_LIKE.sub("***", text)


def server_text(raw: bytes, secrets: Iterable[str]) -> str:
    """The message of an error answer (JSON ``error.message`` / ``detail`` / ``message``, else the text), on one line,
    redacted and at most :data:`MAX_SERVER_TEXT` characters."""
    text = raw[:65536].decode("utf-8", "replace")
    try:
        body = loads(raw[:65536])
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(body, dict) and not message:
            message = body.get("detail") or body.get("message")
        if message:
            text = message if isinstance(message, str) else json.dumps(message)[:4096]
    except NotJson:
        pass
    text = redact(" ".join(text.split()), secrets)
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text[:MAX_SERVER_TEXT] + ("..." if len(text) > MAX_SERVER_TEXT else "")


def loads(raw: bytes) -> Any:
    """JSON of an answer; NotJson (never a RecursionError: 100,000 nested brackets) when it is not plain JSON."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise NotJson(type(e).__name__) from None


def retry_after(headers: Any) -> float | None:
    """Seconds a 429 / 503 asks to wait (``retry-after-ms`` or ``Retry-After``: seconds or an HTTP date); ``inf``
    when the value is unusable or unbounded (the caller gives up on it), None when there is none."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                seconds = when.timestamp() - time.time()
            except (TypeError, ValueError, IndexError, OverflowError):
                return math.inf
        if math.isnan(seconds):
            return math.inf
        return max(0.0, seconds)
    return None


class _Decoder:
    """gzip / deflate decompression with a bound on what one chunk may expand to."""

    def __init__(self, encoding: str):
        encoding = encoding.strip().lower()
        if encoding in ("", "identity"):
            self._z = None
        elif encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._z = zlib.decompressobj()
        else:
            raise NotJson(f"an answer in the Content-Encoding {encoding!r}, which was not asked for")

    def feed(self, data: bytes, room: int) -> Iterator[bytes]:
        """Decompressed bytes of ``data``, stopping (AnswerTooLarge) once more than ``room`` would come out."""
        if self._z is None:
            yield data
            return
        try:
            out = self._z.decompress(data, room + 1)
            while True:
                yield out
                room -= len(out)
                if room < 0:
                    raise AnswerTooLarge
                if not self._z.unconsumed_tail:
                    return
                out = self._z.decompress(self._z.unconsumed_tail, room + 1)
        except zlib.error as e:
            raise NotJson(f"a corrupt compressed answer ({e})") from None


def read_body(response: Any, limit: int, deadline: float, stream: Any) -> bytes:
    """The whole (decompressed) body of a streamed httpx ``response``, at most ``limit`` bytes, before ``deadline``
    (time.monotonic()). ``stream`` is the response's network stream: each read waits at most the time left."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise AnswerTooLarge
    decoder = _Decoder(response.headers.get("content-encoding", ""))
    parts: list[bytes] = []
    size = wire = 0
    for chunk in stream:
        wire += len(chunk)
        if wire > limit:
            raise AnswerTooLarge
        for out in decoder.feed(chunk, limit - size):
            size += len(out)
            if size > limit:
                raise AnswerTooLarge
            parts.append(out)
        if time.monotonic() > deadline:
            raise DeadlinePassed
    return b"".join(parts)


# -- one deadline per request: every socket read and write waits at most the time left ---------------------------------
class Deadlines(threading.local):
    at: float | None = None

    def left(self, timeout: float | None) -> float | None:
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        return left if timeout is None else min(timeout, left)


def install_deadlines(transport: Any, deadlines: Deadlines) -> None:
    """Make ``transport`` (an httpx.HTTPTransport) honour ``deadlines``: its connection pool's network backend is
    wrapped so that connecting, each read and each write time out when the calling thread's deadline has passed."""
    import httpcore

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: Any):
            self.inner = inner

        def _left(self, timeout: float | None, error: type[Exception]) -> float | None:
            left = deadlines.left(timeout)
            if left is not None and left <= 0:
                raise error("the request's deadline (--api_timeout) passed")
            return left

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.inner.read(max_bytes, self._left(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.inner.write(buffer, self._left(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self.inner.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> Any:
            return Stream(self.inner.start_tls(ssl_context, server_hostname,
                                               self._left(timeout, httpcore.ConnectTimeout)))

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def __init__(self, inner: Any):
            self.inner = inner

        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Any:
            left = deadlines.left(timeout)
            if left is not None and left <= 0:
                raise httpcore.ConnectTimeout("the request's deadline (--api_timeout) passed")
            return Stream(self.inner.connect_tcp(host, port, left, local_address, socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
            return Stream(self.inner.connect_unix_socket(path, deadlines.left(timeout), socket_options))

        def sleep(self, seconds: float) -> None:
            self.inner.sleep(seconds)

    pool = transport._pool  # httpx's HTTPTransport keeps its httpcore.ConnectionPool here (httpx 0.28)
    pool._network_backend = Backend(pool._network_backend)
