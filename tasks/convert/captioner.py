"""Caption images through an OpenAI-compatible chat-completions API, concurrently, with retries and a cache.

- The prompt goes as user text next to the image (a JPEG data URL of the RGB image), not as a system message.
- At most ``concurrency`` requests are in flight (asyncio semaphore).
- Retries, with exponential backoff and jitter, only for what is transient: timeouts, connection errors, HTTP 408,
  429 and 5xx; a ``Retry-After`` (or ``retry-after-ms``) header sets the wait. 400/401/403/404 and other statuses stop
  the whole conversion at once with a message naming the model and the status. An image still failing after
  ``max_retries`` is reported as failed, never captioned with an error string.
- Every caption is appended to the caption cache as it arrives (see storage/caption_cache.py); images already in the
  cache cost no request. The API key is handed to the client and nowhere else.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hashlib
import io
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from clipcache.storage.caption_cache import CaptionCache
from clipcache.storage.errors import VLMRequestError
from clipcache.tasks.progress import StageProgress


@dataclass(frozen=True)
class CaptionSettings:
    model: str
    api_base: str
    prompt: str
    max_tokens: int = 512
    temperature: float = 0.0
    timeout: float = 60.0
    concurrency: int = 8
    max_retries: int = 5
    backoff_seconds: float = 0.5
    backoff_cap_seconds: float = 30.0
    # Give up on the whole conversion when no caption has arrived for this long: a hung API costs at most this, not
    # timeout x attempts per image (6 min an image with the defaults). What was captioned is kept.
    stall_timeout: float = 300.0

    def cache_setup(self) -> dict[str, Any]:
        """What determines a caption (the cache key); the API key is not part of it."""
        return {"model": self.model, "api_base": self.api_base, "prompt": self.prompt, "max_tokens": self.max_tokens,
                "temperature": self.temperature}


@dataclass
class CaptionRun:
    captions: list[str | None]
    failures: list[tuple[int, str]] = field(default_factory=list)
    api_calls: int = 0
    from_cache: int = 0
    from_peers: int = 0  # captions another process asked for while this one waited (identical conversions at once)
    stalled: bool = False


class FatalRequestError(VLMRequestError):
    """A status that retrying cannot fix (400, 401, 403, 404, ...): the conversion stops."""


class _Transient(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


def image_jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=92)  # JPEG has no alpha: convert first
    return buf.getvalue()


def retry_after_seconds(headers: Any) -> float | None:
    if headers is None:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time()) if when else None


async def _request(client: Any, settings: CaptionSettings, jpeg: bytes) -> str:
    import openai

    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
    try:
        response = await client.chat.completions.create(
            model=settings.model, max_tokens=settings.max_tokens, temperature=settings.temperature,
            timeout=settings.timeout,
            messages=[{"role": "user", "content": [{"type": "text", "text": settings.prompt},
                                                   {"type": "image_url", "image_url": {"url": url}}]}])
    except (openai.APITimeoutError, openai.APIConnectionError) as e:
        raise _Transient(type(e).__name__) from e
    except (ValueError, openai.APIResponseValidationError) as e:  # HTTP 200 with a body that is not a completion
        raise _Transient(f"malformed response body ({type(e).__name__})") from e
    except openai.APIStatusError as e:
        status = e.status_code
        if status in (408, 429) or status >= 500:
            raise _Transient(f"HTTP {status}", retry_after_seconds(e.response.headers)) from e
        raise FatalRequestError(f"captioning model {settings.model!r} at {settings.api_base} answered HTTP "
                                f"{status} ({type(e).__name__}); not retried") from e
    text = (response.choices[0].message.content or "").strip() if response.choices else ""
    if not text:
        raise _Transient("empty caption")
    return text


async def _caption_with_retries(client: Any, settings: CaptionSettings, jpeg: bytes, counter: list[int]) -> str:
    attempt = 0
    while True:
        counter[0] += 1
        try:
            return await _request(client, settings, jpeg)
        except _Transient as e:
            if attempt >= settings.max_retries:
                raise VLMRequestError(f"{e} after {attempt + 1} attempts") from e
            wait = e.retry_after
            if wait is None:
                wait = min(settings.backoff_cap_seconds, settings.backoff_seconds * 2 ** attempt)
                wait *= random.uniform(0.5, 1.5)  # jitter: do not retry in lock-step
            await asyncio.sleep(wait)
            attempt += 1


async def _caption_all(jobs: dict[str, tuple[bytes, list[int]]], settings: CaptionSettings, api_key: str,
                       cache: CaptionCache, advance, run: CaptionRun) -> None:
    import openai

    counter = [0]
    last_answer = [time.monotonic()]
    semaphore = asyncio.Semaphore(max(1, settings.concurrency))
    stop = asyncio.Event()  # set by a fatal answer, before its slot is released: nothing new is sent after it
    async with openai.AsyncOpenAI(base_url=settings.api_base, api_key=api_key, max_retries=0,
                                  timeout=settings.timeout) as client:

        def done(indices: list[int], caption: str) -> None:
            for i in indices:
                run.captions[i] = caption
            last_answer[0] = time.monotonic()
            advance(len(indices))

        async def one(sha: str, jpeg: bytes, indices: list[int]) -> None:
            while True:
                async with semaphore:
                    if stop.is_set():
                        return
                    if cache.try_claim(sha):
                        try:
                            if (shared := cache.get(sha)) is None and cache.refresh():
                                shared = cache.get(sha)  # finished elsewhere just before this claim
                            if shared is not None:
                                run.from_peers += 1
                                done(indices, shared)
                                return
                            try:
                                caption = await _caption_with_retries(client, settings, jpeg, counter)
                            except FatalRequestError:
                                stop.set()
                                raise
                            except VLMRequestError as e:
                                run.failures.extend((i, str(e)) for i in indices)
                                advance(len(indices))
                                return
                            cache.put(sha, caption)
                        finally:
                            cache.release(sha)
                        done(indices, caption)
                        return
                # another process is asking for this image: free the slot for other images, then look again
                await asyncio.sleep(0.2)
                if cache.get(sha) is None:
                    cache.refresh()
                if (shared := cache.get(sha)) is not None:
                    run.from_peers += 1
                    done(indices, shared)
                    return

        async def watchdog() -> None:
            while True:
                await asyncio.sleep(min(1.0, settings.stall_timeout / 4))
                if time.monotonic() - last_answer[0] > settings.stall_timeout:
                    run.stalled = True
                    stop.set()
                    for t in tasks:
                        t.cancel()
                    return

        tasks = [asyncio.create_task(one(sha, jpeg, idx)) for sha, (jpeg, idx) in jobs.items()]
        guard = asyncio.create_task(watchdog())
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            if not run.stalled:  # Ctrl-C, not the watchdog
                raise
        finally:
            guard.cancel()
            for t in tasks:  # a fatal error (or Ctrl-C) cancels what is still in flight
                t.cancel()
            await asyncio.gather(*tasks, guard, return_exceptions=True)
            run.api_calls = counter[0]
        if run.stalled:
            failed = {i for i, _ in run.failures}
            reason = (f"the API gave no caption for {settings.stall_timeout:g} s (stall_timeout), so the conversion "
                      f"stopped asking")
            run.failures.extend((i, reason) for _, indices in jobs.values() for i in indices
                                if run.captions[i] is None and i not in failed)


def caption_images(images: Iterable[Image.Image], n: int, settings: CaptionSettings, *, api_key: str,
                   cache: CaptionCache, progress: StageProgress, label: str) -> CaptionRun:
    """Captions for the ``n`` ``images`` (same order); identical images are asked for once, cached ones not at all.
    Images are consumed one by one; only those still to be captioned are kept (as JPEG bytes)."""
    run = CaptionRun(captions=[None] * n)
    jobs: dict[str, tuple[bytes, list[int]]] = {}
    for i, image in enumerate(images):
        jpeg = image_jpeg(image)
        sha = hashlib.sha256(jpeg).hexdigest()
        if (cached := cache.get(sha)) is not None:
            run.captions[i] = cached
            run.from_cache += 1
        elif sha in jobs:
            jobs[sha][1].append(i)
        else:
            jobs[sha] = (jpeg, [i])
    with progress.track(f"caption {label}", n, "req") as advance:
        advance(run.from_cache)
        if jobs:
            asyncio.run(_caption_all(jobs, settings, api_key, cache, advance, run))
    return run
