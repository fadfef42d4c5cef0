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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from clipcache.storage.errors import ConfigError, ModelError
from clipcache.tasks.models.api_canaries import CANARY_TEXTS, canary_image, check_canaries
from clipcache.tasks.models.api_client import IMAGE_TOKENS_GUESS, ApiClient, ApiUsage
from clipcache.tasks.models.api_formats import MAX_NORM, MIN_NORM, MalformedResponse, get_format
from clipcache.tasks.models.api_loader import ApiResolvedModel
from clipcache.tasks.models.api_spec import url_credentials
from clipcache.tasks.models.api_text import TextCounter
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
    keeps a local model's. Norms and divisions are float64 (a norm may overflow float32 arithmetic); a row that
    does not come out finite and of unit length is refused here, before anything is cached."""
    vectors = np.asarray(vectors, dtype=np.float32)
    wide = vectors.astype(np.float64)
    norms = np.linalg.norm(wide, axis=1, keepdims=True)
    if not (np.isfinite(norms).all() and (norms[:, 0] >= MIN_NORM).all() and (norms[:, 0] <= MAX_NORM).all()):
        raise MalformedResponse("an embedding's norm is zero, denormal or beyond float32")
    off = np.abs(norms - 1.0) > 1e-6
    rows = np.where(off, (wide / norms).astype(np.float32), vectors).astype(np.float32)
    if not np.isfinite(rows).all() or np.abs(np.linalg.norm(rows.astype(np.float64), axis=1) - 1.0).max() > 1e-3:
        raise MalformedResponse("an embedding does not normalise to a finite unit vector")
    return rows, norms[:, 0].astype(np.float32)


def token_count_name(settings: Any) -> str:
    return (f"counted with the tokenizer {Path(settings.tokenizer).name}" if settings.tokenizer else
            "estimated at 4 characters a token, 85 an image")


def cost_line(resolved: ApiResolvedModel, u: ApiUsage) -> str:
    """The line a run ends with: what the model's requests cost (``u``: every client's counts together). Tokens
    are clipcache's own count (--api_tokenizer, else an estimate: what --api_tpm throttles on); what the server
    reported is shown beside it. The price uses the tokenizer's count when one is named, else the server's when
    every answer reported one, else the estimate; the line says which."""
    settings = resolved.settings
    tokens = f"{u.tokens_local:,} tokens ({token_count_name(settings)})"
    reported = (f", server reported {u.tokens_reported:,}" if u.tokens_reported or not u.answers_unreported else
                "")
    if u.answers_unreported and u.tokens_reported:
        reported += f" ({u.answers_unreported:,} answers without usage)"
    use_server = not settings.tokenizer and not u.answers_unreported and u.requests > 0
    billed, which = (u.tokens_reported, "the server's count") if use_server else (u.tokens_local, "our count")
    price_per_1k = settings.price_per_1k
    price = (f", est. ${billed / 1000 * price_per_1k:,.4f} at ${price_per_1k:g} per 1k tokens ({which})"
             if price_per_1k is not None else "")
    tokens += reported
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
        if not api_key and url_credentials(settings.api_base) is None:
            hint = "" if settings.key_env != "OPENAI_API_KEY" else " (or name another variable with --api_key_env)"
            raise ConfigError(f"{self.label}: no API key: set the environment variable {settings.key_env}{hint}")
        super().__init__(torch.nn.Identity(), device, amp=False)
        self.format = get_format(settings.request_format)
        self.counter = TextCounter(settings, self.label)
        self.client = ApiClient(settings, api_key or "", self.format.path, self.label)
        self.dim: int | None = None
        self._urls: dict[int, str] = {}
        self._handles = itertools.count()
        self._lock = threading.Lock()
        self._checked: set[str] = set()  # modalities whose canaries were checked (lazily: a run may need one)
        self._check_lock = threading.Lock()
        self._role = threading.local()
        self._closed = False
        if settings.max_tokens is None:
            self.counter.declared_max(self.client.listing(), self.model_id)

    # -- roles ------------------------------------------------------------------------------------------------------
    @contextmanager
    def texts_as(self, kind: str) -> Iterator[None]:
        """Texts encoded inside are of ``kind`` (the encode stage's: query, document, prompt, caption, ...): queries
        go with the query role and prefix, every other kind as documents."""
        before = getattr(self._role, "value", "document")
        self._role.value = "query" if kind.startswith("query") else "document"
        try:
            yield
        finally:
            self._role.value = before

    def _prefixed(self, texts: list[str], role: str) -> list[str]:
        prefix = self.settings.query_prefix if role == "query" else self.settings.document_prefix
        return [prefix + t for t in texts] if prefix else texts

    # -- the drift check, per modality, before the first request of that modality ---------------------------------
    def _ensure_canaries(self, modality: str) -> None:
        if modality in self._checked:
            return
        with self._check_lock:
            if modality in self._checked:
                return
            stop = threading.Event()
            if modality == "text":
                vectors = self._texts(list(CANARY_TEXTS), stop, canary=True, role="document")
            else:
                vectors = self._images([png_data_url(canary_image())], stop, canary=True)
            if self.dim is not None and vectors.shape[1] != self.dim:
                raise ModelError(f"{self.label}: texts and images are embedded in different dimensions "
                                 f"({vectors.shape[1]} for {modality}s, {self.dim} for the other); an image-text "
                                 f"model answers one space for both")
            self.dim = int(vectors.shape[1])
            folder = self.resolved.canary_dir
            path = Path(folder) / f"{self.resolved.fingerprint}.json" if folder else None
            check_canaries(normalised(vectors), path, self.resolved.identity, self.label, self.resolved.revision or "",
                           modality)
            self._checked.add(modality)

    # -- requests --------------------------------------------------------------------------------------------------
    def _answer(self, payload: dict, n: int, estimate: int, what: str, stop: threading.Event, *,
                canary: bool, images: bool) -> tuple[np.ndarray, int | None]:
        body, _ = self.client.post(payload, estimate=estimate, what=what, stop=stop, canary=canary, inputs=n,
                                   images=images)
        try:
            vectors, tokens = self.format.parse(body, n)
            normalised_and_norms(vectors)  # every vector checked before anything of the answer is used
        except MalformedResponse as e:
            raise ModelError(f"{self.label}: malformed answer to {what}: {self.client.redact(str(e))}; nothing of it "
                             f"was kept (check --api_base and --api_format)") from None
        wanted = self.settings.dimensions or self.dim
        if wanted is not None and vectors.shape[1] != wanted:
            raise ModelError(f"{self.label}: answered {vectors.shape[1]}-dimensional vectors for {what}, "
                             f"{'--api_dimensions asked for' if self.settings.dimensions else 'before:'} {wanted}; "
                             f"nothing of it was kept")
        return vectors, tokens

    def _texts(self, texts: list[str], stop: threading.Event, canary: bool = False,
               role: str | None = None) -> np.ndarray:
        role = role or str(getattr(self._role, "value", "document"))
        sent = self._prefixed(texts, role)
        counts = self.counter.counts(sent)
        what = f"{len(texts)} {'canary ' if canary else ''}{role} text(s)"
        self.counter.check(sent, counts, what)
        payload = self.format.options(self.format.text_request(self.model_id, sent, self.settings.encoding_format),
                                      role=role if self.settings.roles else None,
                                      dimensions=self.settings.dimensions, images=False)
        vectors, tokens = self._answer(payload, len(texts), sum(counts), what, stop, canary=canary, images=False)
        self.client.count(texts=0 if canary else len(texts), estimated=sum(counts), reported=tokens)
        return vectors

    def _images(self, urls: list[str], stop: threading.Event, canary: bool = False) -> np.ndarray:
        if not self.format.images:
            raise ModelError(f"{self.label}: --api_format {self.settings.request_format} sends no images; this task "
                             f"needs image embeddings (see clipcache models --api-formats)")
        estimate = IMAGE_TOKENS_GUESS * len(urls)
        payload = self.format.options(self.format.image_request(self.model_id, urls, self.settings.encoding_format),
                                      role=None, dimensions=self.settings.dimensions, images=True)
        what = f"{len(urls)} {'canary ' if canary else ''}image(s)"
        vectors, tokens = self._answer(payload, len(urls), estimate, what, stop, canary=canary, images=True)
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
        self._ensure_canaries("image")
        per = max(1, self.format.images_per_request)
        groups = [urls[i:i + per] for i in range(0, len(urls), per)]
        jobs: list[Callable[[threading.Event], np.ndarray]] = [partial(self._images, group) for group in groups]
        return normalised_and_norms(np.concatenate(self.client.run_all(jobs)))

    def encode_texts_with_norms(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        if not texts:
            return np.zeros((0, self.dim or 0), dtype=np.float32), np.zeros(0, dtype=np.float32)
        self._ensure_canaries("text")
        return normalised_and_norms(self._texts(texts, threading.Event()))

    @property
    def text_batches_at_once(self) -> int:  # type: ignore[override]
        return self.settings.concurrency

    def encode_text_batches(self, batches: list[list[str]]) -> tuple[np.ndarray, np.ndarray | None]:
        if not any(batches):
            return self.encode_texts_with_norms([])
        self._ensure_canaries("text")
        role = getattr(self._role, "value", "document")  # the pool's threads do not see this thread's role
        jobs: list[Callable[[threading.Event], np.ndarray]] = [partial(self._texts, batch, role=role)
                                                               for batch in batches if batch]
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
