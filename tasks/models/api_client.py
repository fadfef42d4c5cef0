"""HTTP plumbing of API embedding models: bounded concurrency, rate limits, retries, usage counts.

- At most ``concurrency`` requests are in flight (a thread pool over one pooled ``httpx.Client``: the encode stage
  calls models synchronously, batch by batch).
- Requests-per-minute and tokens-per-minute limits are token buckets refilled continuously that hold one second's
  allowance (at least one unit): requests are spread evenly, and no 60-second window holds more than the limit plus
  that second's worth (a full minute's burst at the start would double the limit in the first minute). A request
  reserves its tokens before it is sent (an estimate: about 4 characters per token for text, the running mean of
  what the server reported for an image); the server's reported usage corrects the bucket afterwards.
- Retries, as in the captioning client (tasks/convert/captioner.py), only for what is transient: timeouts,
  connection errors, HTTP 408, 429 and 5xx, with exponential backoff and jitter; a ``Retry-After`` (or
  ``retry-after-ms``) header sets the wait, and holds back every other request too. Other statuses and malformed
  answers stop at once with one line naming the model.
- The API key goes into the client's Authorization header and nowhere else: never into a message, a log line or a
  file.
"""

from __future__ import annotations

import math
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from clipcache.storage.errors import ModelError
from clipcache.tasks.convert.captioner import retry_after_seconds
from clipcache.tasks.models.api_spec import ApiSettings

T = TypeVar("T")

IMAGE_TOKENS_GUESS = 85  # tokens reserved for an image before the server has reported any (OpenAI's low-detail cost)


def estimate_text_tokens(texts: Sequence[str]) -> int:
    """About 4 characters per token (OpenAI's rule of thumb), at least 1 per text."""
    return sum(max(1, math.ceil(len(text) / 4)) for text in texts)


class TokenBucket:
    """``per_minute`` units a minute, refilled continuously, holding one second's worth (at least 1; full at start).
    ``reserve`` may take the level below zero: the caller waits until it is paid back, so callers queue in order."""

    def __init__(self, per_minute: float, now: float):
        self.rate = float(per_minute) / 60.0
        self.capacity = max(1.0, self.rate)
        self.level = self.capacity
        self.stamp = now

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def reserve(self, amount: float, now: float) -> float:
        """Take ``amount``; seconds to wait before using it."""
        self._refill(now)
        self.level -= float(amount)
        return 0.0 if self.level >= 0 else -self.level / self.rate

    def give_back(self, amount: float, now: float) -> None:
        """Correct a reservation: positive gives units back, negative takes more."""
        self._refill(now)
        self.level = min(self.capacity, self.level + amount)


class RateLimiter:
    def __init__(self, rpm: float | None, tpm: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.clock, self.sleep = clock, sleep
        now = clock()
        self.requests = TokenBucket(rpm, now) if rpm else None
        self.tokens = TokenBucket(tpm, now) if tpm else None
        self.not_before = now
        self._lock = threading.Lock()

    def acquire(self, tokens: int) -> float:
        """Wait until one request of ``tokens`` tokens may be sent; returns the seconds waited."""
        with self._lock:
            now = self.clock()
            delay = max(0.0, self.not_before - now)
            if self.requests is not None:
                delay = max(delay, self.requests.reserve(1, now))
            if self.tokens is not None:
                delay = max(delay, self.tokens.reserve(tokens, now))
        if delay > 0:
            self.sleep(delay)
        return delay

    def correct(self, estimated: int, actual: int) -> None:
        if self.tokens is not None:
            with self._lock:
                self.tokens.give_back(estimated - actual, self.clock())

    def hold(self, seconds: float) -> None:
        """Send nothing for ``seconds`` (a Retry-After applies to the whole client, not only to its request)."""
        with self._lock:
            self.not_before = max(self.not_before, self.clock() + seconds)


@dataclass
class ApiUsage:
    requests: int = 0  # every attempt sent, retries and canaries included
    retries: int = 0
    canary_requests: int = 0
    texts: int = 0
    images: int = 0
    tokens_reported: int = 0
    tokens_estimated: int = 0  # tokens of answers that reported no usage

    @property
    def tokens(self) -> int:
        return self.tokens_reported + self.tokens_estimated

    def plus(self, other: ApiUsage) -> ApiUsage:
        return ApiUsage(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def minus(self, other: ApiUsage) -> ApiUsage:
        return ApiUsage(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


class _Transient(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class _Stopped(Exception):
    """Another request of the same call failed: this one is not sent (or retried)."""


def _server_message(response: Any) -> str:
    try:
        body = response.json()
        message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("error")
        text = str(message or body.get("detail") or body.get("message") or "")
    except (ValueError, AttributeError):
        text = response.text
    text = " ".join(text.split())
    return text[:200] + ("..." if len(text) > 200 else "")


class DaemonPool:
    """``n`` daemon worker threads. ThreadPoolExecutor's workers are joined at interpreter exit, so Ctrl-C during a
    stalled request would wait for its timeout (a minute by default); these are not waited for."""

    def __init__(self, n: int, name: str):
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple] | None] = queue.SimpleQueue()
        self._n = n
        for i in range(n):
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to the caller through the future
                future.set_exception(e)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        for _ in range(self._n):
            self._jobs.put(None)


class ApiClient:
    """One model's connection to its API. ``label`` names the model in every message."""

    def __init__(self, settings: ApiSettings, api_key: str, path: str, label: str):
        import httpx

        self.settings = settings
        self.label = label
        self.url = settings.api_base + path
        self.usage = ApiUsage()
        self.limiter = RateLimiter(settings.rpm, settings.tpm)
        self._usage_lock = threading.Lock()
        self._image_tokens: list[int] = []
        self._http = httpx.Client(headers={"Authorization": f"Bearer {api_key}"}, timeout=settings.timeout,
                                  limits=httpx.Limits(max_connections=settings.concurrency,
                                                      max_keepalive_connections=settings.concurrency))
        self._pool = DaemonPool(settings.concurrency, "clipcache-api")

    def usage_now(self) -> ApiUsage:
        """A copy of the counts so far."""
        with self._usage_lock:
            return replace(self.usage)

    def add_usage(self, usage: ApiUsage) -> None:
        """Count what other clients of the same model spent (sharded workers), for the cost line."""
        with self._usage_lock:
            self.usage = self.usage.plus(usage)

    # -- one request, with retries ---------------------------------------------------------------------------------
    def image_tokens_guess(self) -> int:
        with self._usage_lock:
            seen = self._image_tokens[-100:]
        return round(sum(seen) / len(seen)) if seen else IMAGE_TOKENS_GUESS

    def post(self, payload: dict[str, Any], *, estimate: int, what: str, stop: threading.Event | None = None,
             canary: bool = False) -> tuple[Any, int]:
        """The decoded JSON answer to ``payload`` and the attempts it took; ModelError when it cannot be had."""
        import httpx

        attempt = 0
        while True:
            if stop is not None and stop.is_set():
                raise _Stopped
            self.limiter.acquire(estimate)
            with self._usage_lock:
                self.usage.requests += 1
                self.usage.retries += attempt > 0
                self.usage.canary_requests += canary
            try:
                response = self._http.post(self.url, json=payload)
            except httpx.TimeoutException as e:
                problem = _Transient(f"no answer within {self.settings.timeout:g} s (--api_timeout)")
                problem.__cause__ = e
            except httpx.TransportError as e:
                problem = _Transient(f"cannot reach {self.settings.api_base} ({type(e).__name__})")
                problem.__cause__ = e
            else:
                status = response.status_code
                if 200 <= status < 300:
                    try:
                        return response.json(), attempt + 1
                    except ValueError as e:
                        raise ModelError(f"{self.label}: the answer to {what} is not JSON (HTTP {status}, "
                                         f"{len(response.content)} bytes); check --api_base and --api_format") from e
                if status not in (408, 429) and status < 500:
                    hint = " (check the key in $" + self.settings.key_env + ")" if status in (401, 403) else ""
                    raise ModelError(f"{self.label} at {self.settings.api_base}: HTTP {status} for {what}: "
                                     f"{_server_message(response) or 'no message'}{hint}; not retried")
                problem = _Transient(f"HTTP {status}", retry_after_seconds(response.headers))
            if attempt >= self.settings.max_retries:
                raise ModelError(f"{self.label} at {self.settings.api_base}: {problem} for {what}, after "
                                 f"{attempt + 1} attempt(s) (--api_max_retries {self.settings.max_retries}); what was "
                                 f"embedded is cached, so the same command continues") from problem
            delay = problem.retry_after
            if delay is None:
                delay = min(self.settings.backoff_cap_seconds, self.settings.backoff_seconds * 2 ** attempt)
                delay *= random.uniform(0.5, 1.5)  # jitter: do not retry in lock-step
            else:
                self.limiter.hold(delay)
            if stop is not None:
                if stop.wait(delay):
                    raise _Stopped
            else:
                time.sleep(delay)
            attempt += 1

    def count(self, *, texts: int = 0, images: int = 0, estimated: int, reported: int | None) -> None:
        """Record an answer: what it embedded and its tokens (the server's count, else the estimate)."""
        if reported is not None:
            self.limiter.correct(estimated, reported)
        with self._usage_lock:
            self.usage.texts += texts
            self.usage.images += images
            if reported is None:
                self.usage.tokens_estimated += estimated
            else:
                self.usage.tokens_reported += reported
                if images and not texts:
                    self._image_tokens.append(max(1, round(reported / images)))

    # -- several requests at once ----------------------------------------------------------------------------------
    def run_all(self, jobs: Sequence[Callable[[threading.Event], T]]) -> list[T]:
        """Run ``jobs`` (each given a stop event) at most ``concurrency`` at a time, results in order. The first
        failure stops the others (nothing new is sent) and is raised."""
        stop = threading.Event()
        if len(jobs) <= 1 or self.settings.concurrency == 1:
            return [job(stop) for job in jobs]
        futures = [self._pool.submit(job, stop) for job in jobs]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f in done and f.exception() is not None), None)
            if failed is not None:
                raise failed.exception()  # type: ignore[misc]
            return [future.result() for future in futures]
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise

    def close(self) -> None:
        self._pool.shutdown()
        self._http.close()
