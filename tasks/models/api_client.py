"""HTTP plumbing of API embedding models: bounded concurrency, rate limits, retries, usage counts.

- At most ``concurrency`` requests are in flight (a thread pool over one pooled ``httpx.Client``: the encode stage
  calls models synchronously, batch by batch).
- Requests-per-minute and tokens-per-minute limits are token buckets refilled continuously that hold one second's
  allowance (at least one unit): requests are spread evenly, and no 60-second window holds more than the limit plus
  that second's worth (a full minute's burst at the start would double the limit in the first minute). A request
  reserves its tokens before it is sent (an estimate: about 4 characters per token for text, the running mean of
  ``IMAGE_TOKENS_GUESS`` an image, or the count of ``--api_tokenizer``). The usage a server reports is shown in the
  cost line but never throttles: servers count characters, or anything.
- Retries, as in the captioning client (tasks/convert/captioner.py), only for what is transient: timeouts,
  connection errors, HTTP 408, 429 and 5xx, with exponential backoff and jitter; a ``Retry-After`` (or
  ``retry-after-ms``) header sets the wait, and holds back every other request too (one beyond
  ``api_http.MAX_RETRY_AFTER`` ends the run instead). Other statuses and malformed answers stop at once with one line
  naming the model.
- Answers are bounded in size and time (tasks/models/api_http.py): ``--api_timeout`` is each attempt's deadline.
- The API key goes into the client's Authorization header and nowhere else: never into a message, a log line or a
  file; server text in a message is redacted first (a proxy may echo the request's headers).
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
from clipcache.tasks.models.api_http import (
    MAX_RETRY_AFTER,
    AnswerTooLarge,
    DeadlinePassed,
    Deadlines,
    NotJson,
    install_deadlines,
    loads,
    max_answer_bytes,
    read_body,
    redact,
    retry_after,
    server_text,
)
from clipcache.tasks.models.api_spec import ApiSettings, url_credentials

T = TypeVar("T")

IMAGE_TOKENS_GUESS = 85  # tokens counted for an image (OpenAI's low-detail cost): no local count exists


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
    tokens_local: int = 0  # counted here: with --api_tokenizer, else estimated (what --api_tpm throttles on)
    tokens_reported: int = 0  # what the server's answers said they used (never used for throttling)
    answers_unreported: int = 0  # answers without a usage block

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
        credentials = url_credentials(settings.api_base)
        self._secrets = [s for s in (api_key, *(credentials or ())) if s]
        headers = {"Accept-Encoding": "gzip, deflate"}  # what read_body decompresses (with a bound)
        if credentials is None:
            headers["Authorization"] = f"Bearer {api_key}"
        self._deadlines = Deadlines()
        limits = httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency)
        transport = httpx.HTTPTransport(limits=limits)
        install_deadlines(transport, self._deadlines)
        self._http = httpx.Client(headers=headers, timeout=settings.timeout, transport=transport,
                                  auth=credentials, follow_redirects=False)
        self._pool = DaemonPool(settings.concurrency, "clipcache-api")

    def usage_now(self) -> ApiUsage:
        """A copy of the counts so far."""
        with self._usage_lock:
            return replace(self.usage)

    def add_usage(self, usage: ApiUsage) -> None:
        """Count what other clients of the same model spent (sharded workers), for the cost line."""
        with self._usage_lock:
            self.usage = self.usage.plus(usage)

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)

    # -- one request, with retries ---------------------------------------------------------------------------------
    def _send(self, payload: dict[str, Any], inputs: int) -> tuple[int, bytes, Any]:
        """(status, body, headers) of one attempt, within the request's deadline and size bounds."""
        self._deadlines.at = deadline = time.monotonic() + self.settings.timeout
        try:
            with self._http.stream("POST", self.url, json=payload) as response:
                ok = 200 <= response.status_code < 300
                if ok:
                    body = read_body(response, max_answer_bytes(inputs), deadline, response.iter_raw())
                else:  # an error's text: its first 64 KiB are plenty
                    body = b""
                    for chunk in response.iter_raw():
                        body += chunk
                        if len(body) >= 65536 or time.monotonic() > deadline:
                            break
                    if response.headers.get("content-encoding", "").lower() in ("gzip", "deflate", "x-gzip"):
                        body = b"(a compressed error text)"
                return response.status_code, body, response.headers
        finally:
            self._deadlines.at = None

    def listing(self) -> Any:
        """The server's model listing (``GET {api_base}/models``) as JSON, or None (not offered, not JSON, too big,
        too slow: a listing is a hint, never required)."""
        import httpx

        self._deadlines.at = deadline = time.monotonic() + min(self.settings.timeout, 10.0)
        try:
            with self._http.stream("GET", self.settings.api_base + "/models") as response:
                if response.status_code != 200:
                    return None
                return loads(read_body(response, 1 << 20, deadline, response.iter_raw()))
        except (httpx.HTTPError, AnswerTooLarge, DeadlinePassed, NotJson):
            return None
        finally:
            self._deadlines.at = None

    def post(self, payload: dict[str, Any], *, estimate: int, what: str, stop: threading.Event | None = None,
             canary: bool = False, inputs: int = 1, images: bool = False) -> tuple[Any, int]:
        """The decoded JSON answer to ``payload`` and the attempts it took; ModelError when it cannot be had."""
        import httpx

        attempt = 0
        where = f"{self.label} at {self.settings.api_base}"
        while True:
            if stop is not None and stop.is_set():
                raise _Stopped
            self.limiter.acquire(estimate)
            with self._usage_lock:
                self.usage.requests += 1
                self.usage.retries += attempt > 0
                self.usage.canary_requests += canary
            try:
                status, body, headers = self._send(payload, inputs)
            except (httpx.TimeoutException, DeadlinePassed):
                problem = _Transient(f"no answer within {self.settings.timeout:g} s (--api_timeout)")
            except httpx.TransportError as e:
                problem = _Transient(f"cannot reach {self.settings.api_base} ({type(e).__name__})")
            except AnswerTooLarge:
                raise ModelError(f"{where}: the answer to {what} is larger than {max_answer_bytes(inputs) >> 20} MiB "
                                 f"(on the wire or decompressed); nothing of it was kept; not retried") from None
            except NotJson as e:
                raise ModelError(f"{where}: the answer to {what} cannot be read: {self.redact(str(e))}; nothing of it "
                                 f"was kept; not retried") from None
            else:
                if 200 <= status < 300:
                    try:
                        return loads(body), attempt + 1
                    except NotJson as e:
                        raise ModelError(f"{self.label}: the answer to {what} is not JSON ({e}; HTTP {status}, "
                                         f"{len(body)} bytes); check --api_base and --api_format") from None
                if status not in (408, 429) and status < 500:
                    raise ModelError(f"{where}: HTTP {status} for {what}"
                                     f"{' at ' + self.url if status in (404, 405) else ''}: "
                                     f"{server_text(body, self._secrets) or 'no message'}"
                                     f"{self._hint(status, images)}; not retried") from None
                problem = _Transient(f"HTTP {status}", retry_after(headers))
            delay = problem.retry_after
            if delay is not None and delay > MAX_RETRY_AFTER:
                raise ModelError(f"{where}: {problem} for {what} with Retry-After "
                                 f"{'beyond any bound' if math.isinf(delay) else f'{delay:.0f} s'} (clipcache waits "
                                 f"at most {MAX_RETRY_AFTER:.0f} s); what was embedded is cached, so the same command "
                                 f"continues later") from None
            if attempt >= self.settings.max_retries:
                raise ModelError(f"{where}: {problem} for {what}, after {attempt + 1} attempt(s) (--api_max_retries "
                                 f"{self.settings.max_retries}); what was embedded is cached, so the same command "
                                 f"continues") from None
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

    def _hint(self, status: int, images: bool) -> str:
        if status in (401, 403):
            return f" (check the key in ${self.settings.key_env})"
        if status in (404, 405):
            return (" (check --api_base: it is the base URL the API's paths go under, usually ending in /v1, e.g. "
                    "http://HOST:PORT/v1)")
        if status in (400, 415, 422) and images:
            from clipcache.tasks.models.api_formats import API_FORMATS

            return (f" (the server may take images in another form, or not at all: --api_format "
                    f"{self.settings.request_format} is in use; others: {', '.join(API_FORMATS.names())}; see "
                    f"clipcache models --api-formats)")
        return ""

    def count(self, *, texts: int = 0, images: int = 0, estimated: int, reported: int | None) -> None:
        """Record an answer: what it embedded, the tokens counted here (``estimated``: the tokenizer's count or the
        estimate, which is also what --api_tpm reserved) and the server's own count, if it gave one. The server's
        count never changes throttling: a server may count characters, or make numbers up."""
        with self._usage_lock:
            self.usage.texts += texts
            self.usage.images += images
            self.usage.tokens_local += estimated
            if reported is None:
                self.usage.answers_unreported += 1
            else:
                self.usage.tokens_reported += reported

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


HOSTED_FORMATS = {"api.cohere.com": "cohere", "api.cohere.ai": "cohere", "api.voyageai.com": "voyage",
                  "api.jina.ai": "jina"}


def detect_format(settings: ApiSettings, model_id: str, label: str) -> str:
    """``--api_format auto``: the format of a hosted API known by its host, else what the server's model listing
    (``GET {api_base}/models``) says: an entry ``owned_by`` infinity is infinity's server, any other listing the
    OpenAI form (vLLM, TEI, OpenAI). A server without a listing is one line asking for a format."""
    import os
    from urllib.parse import urlsplit

    host = (urlsplit(settings.api_base).hostname or "").lower()
    if host in HOSTED_FORMATS:
        return HOSTED_FORMATS[host]
    client = ApiClient(settings, os.environ.get(settings.key_env, ""), "/embeddings", label)
    try:
        listing = client.listing()
    finally:
        client.close()
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list):
        raise ModelError(f"{label}: --api_format auto: {settings.api_base}/models gives no model listing; name the "
                         f"format (clipcache models --api-formats)")
    owners = {str(e.get("owned_by", "")).lower() for e in entries if isinstance(e, dict) and e.get("id") == model_id}
    return "infinity" if "infinity" in owners else "openai"
