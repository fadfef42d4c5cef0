"""An embedding model behind an HTTP API, driven by the normal encode stage (so the cache writer's chunked commits,
resume and locks apply unchanged).

Images: ``image_transform`` runs in the encode stage's decoding threads and turns each image into a lossless PNG
data URL (the server does its own preprocessing); it returns a one-element tensor holding a handle to that URL, so
batches stack like pixels. ``encode_images`` sends the batch's images concurrently, one request per image with the
built-in format. Texts: one request per batch (``--batch_size`` texts), up to ``--api_concurrency`` batches in flight
(``encode_text_batches``). The model is ``batch_invariant``: on resume
the encode stage asks it only for rows not yet committed, so a killed run re-requests nothing it had stored.
"""

from __future__ import annotations

import base64
import io
import itertools
import logging
import os
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from clipcache.storage.errors import ConfigError, ModelError
from clipcache.tasks.models.api_canaries import CANARY_TEXTS, canary_image, check_canaries
from clipcache.tasks.models.api_client import ApiClient, ApiUsage, estimate_text_tokens
from clipcache.tasks.models.api_formats import MalformedResponse, get_format
from clipcache.tasks.models.api_loader import ApiResolvedModel
from clipcache.tasks.models.base import EmbeddingModel

log = logging.getLogger("clipcache.models")


def png_data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def normalised_and_norms(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(L2-normalised float32 rows, each answered vector's L2 norm as float32). Rows the server already normalised
    (within 1e-6) keep its exact bits, so vectors match the same model run locally bit for bit; the norms are what
    the encode stage keeps beside the rows (raw features = row x norm, the vectors the server answered), as it
    keeps a local model's."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    off = np.abs(norms - 1.0) > 1e-6
    rows = np.where(off, vectors / norms.astype(np.float32), vectors).astype(np.float32)
    return rows, norms[:, 0].astype(np.float32)


def cost_line(resolved: ApiResolvedModel, u: ApiUsage) -> str:
    """The line a run ends with: what the model's requests cost (``u``: every client's counts together)."""
    tokens = f"{u.tokens:,} tokens" + (" (estimated)" if u.tokens_estimated and not u.tokens_reported else
                                       f" ({u.tokens_estimated:,} estimated)" if u.tokens_estimated else "")
    price_per_1k = resolved.settings.price_per_1k
    price = (f", est. ${u.tokens / 1000 * price_per_1k:,.4f} at ${price_per_1k:g} per 1k tokens"
             if price_per_1k is not None else "")
    return (f"api model {resolved.source!r} @ {resolved.revision}: {u.requests:,} requests ({u.canary_requests} "
            f"canary), {u.images:,} images, {u.texts:,} texts, {tokens}, {u.retries:,} retries{price}")


def report_usage(resolved: ApiResolvedModel, usage: ApiUsage, report: bool) -> None:
    """The cost line of a model this process never loaded (every request went from sharded workers)."""
    line = cost_line(resolved, usage)
    if report:
        print(line, file=sys.stderr, flush=True)
    else:
        log.info("%s", line)


def normalised(vectors: np.ndarray) -> np.ndarray:
    """L2-normalised float32 (see :func:`normalised_and_norms`)."""
    return normalised_and_norms(vectors)[0]


class ApiEmbeddingModel(EmbeddingModel):
    batch_invariant = True

    def __init__(self, resolved: ApiResolvedModel, device: torch.device):
        settings = resolved.settings
        self.resolved, self.settings = resolved, settings
        self.model_id = resolved.source
        self.label = f"api model {self.model_id!r}"
        api_key = os.environ.get(settings.key_env)
        if not api_key:
            hint = "" if settings.key_env != "OPENAI_API_KEY" else " (or name another variable with --api_key_env)"
            raise ConfigError(f"{self.label}: no API key: set the environment variable {settings.key_env}{hint}")
        super().__init__(torch.nn.Identity(), device, amp=False)
        self.format = get_format(settings.request_format)
        self.client = ApiClient(settings, api_key, self.format.path, self.label)
        self.dim: int | None = None
        self._urls: dict[int, str] = {}
        self._handles = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._check_canaries()
        except BaseException:
            self.client.close()
            raise

    # -- the drift check -------------------------------------------------------------------------------------------
    def _check_canaries(self) -> None:
        texts = self._texts(list(CANARY_TEXTS), threading.Event(), canary=True)
        image = self._images([png_data_url(canary_image())], threading.Event(), canary=True)
        if texts.shape[1] != image.shape[1]:
            raise ModelError(f"{self.label}: texts are embedded in {texts.shape[1]} dimensions and images in "
                             f"{image.shape[1]}; an image-text model answers one space for both")
        self.dim = int(texts.shape[1])
        path = Path(self.resolved.canary_dir) / f"{self.resolved.fingerprint}.json" if self.resolved.canary_dir \
            else None
        check_canaries(normalised(np.concatenate([texts, image])), path, self.resolved.identity, self.label,
                       self.resolved.revision or "")

    # -- requests --------------------------------------------------------------------------------------------------
    def _answer(self, payload: dict, n: int, estimate: int, what: str, stop: threading.Event,
                canary: bool) -> tuple[np.ndarray, int | None]:
        body, _ = self.client.post(payload, estimate=estimate, what=what, stop=stop, canary=canary)
        try:
            vectors, tokens = self.format.parse(body, n)
        except MalformedResponse as e:
            raise ModelError(f"{self.label}: malformed answer to {what}: {e} (check --api_base and --api_format)") \
                from e
        if self.dim is not None and vectors.shape[1] != self.dim:
            raise ModelError(f"{self.label}: answered {vectors.shape[1]}-dimensional vectors for {what}, "
                             f"{self.dim} before; the model behind the API changed during the run")
        return vectors, tokens

    def _texts(self, texts: list[str], stop: threading.Event, canary: bool = False) -> np.ndarray:
        estimate = estimate_text_tokens(texts)
        payload = self.format.text_request(self.model_id, texts, self.settings.encoding_format)
        vectors, tokens = self._answer(payload, len(texts), estimate, f"{len(texts)} text(s)", stop, canary)
        self.client.count(texts=0 if canary else len(texts), estimated=estimate, reported=tokens)
        return vectors

    def _images(self, urls: list[str], stop: threading.Event, canary: bool = False) -> np.ndarray:
        estimate = self.client.image_tokens_guess() * len(urls)
        payload = self.format.image_request(self.model_id, urls, self.settings.encoding_format)
        vectors, tokens = self._answer(payload, len(urls), estimate, f"{len(urls)} image(s)", stop, canary)
        self.client.count(images=0 if canary else len(urls), estimated=estimate, reported=tokens)
        return vectors

    # -- the EmbeddingModel interface ------------------------------------------------------------------------------
    def image_transform(self, image: Image.Image) -> torch.Tensor:
        url = png_data_url(image)
        with self._lock:
            handle = next(self._handles)
            self._urls[handle] = url
        return torch.tensor([handle], dtype=torch.int64)

    # The API's vectors as answered are the model's raw features: their norms are kept beside the normalised rows,
    # as the encode stage keeps a local model's, so tasks that sum raw vectors (mteb's image + text fusion) have them.
    def encode_images_with_norms(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        with self._lock:
            urls = [self._urls.pop(int(h)) for h in pixels.reshape(-1).tolist()]
        per = max(1, self.format.images_per_request)
        groups = [urls[i:i + per] for i in range(0, len(urls), per)]
        jobs: list[Callable[[threading.Event], np.ndarray]] = [partial(self._images, group) for group in groups]
        return normalised_and_norms(np.concatenate(self.client.run_all(jobs)))

    def encode_texts_with_norms(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        if not texts:
            return np.zeros((0, self.dim or 0), dtype=np.float32), np.zeros(0, dtype=np.float32)
        return normalised_and_norms(self._texts(texts, threading.Event()))

    @property
    def text_batches_at_once(self) -> int:  # type: ignore[override]
        return self.settings.concurrency

    def encode_text_batches(self, batches: list[list[str]]) -> tuple[np.ndarray, np.ndarray | None]:
        jobs: list[Callable[[threading.Event], np.ndarray]] = [partial(self._texts, batch) for batch in batches if batch]
        if not jobs:
            return self.encode_texts_with_norms([])
        return normalised_and_norms(np.concatenate(self.client.run_all(jobs)))

    def encode_images(self, pixels: torch.Tensor) -> np.ndarray:
        return self.encode_images_with_norms(pixels)[0]

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        return self.encode_texts_with_norms(texts)[0]

    # -- the end of the run ----------------------------------------------------------------------------------------
    def cost_line(self) -> str:
        return cost_line(self.resolved, self.client.usage_now())

    def usage(self) -> ApiUsage:
        return self.client.usage_now()

    def add_usage(self, usage: ApiUsage) -> None:
        self.client.add_usage(usage)

    def close(self, report: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        line = self.cost_line()
        if report:
            print(line, file=sys.stderr, flush=True)
        else:  # a failed run ends in its one error line; what it spent is in the log (-v)
            log.info("%s", line)
        with self._lock:
            self._urls.clear()
        self.client.close()
