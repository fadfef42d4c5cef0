"""Request formats of embedding APIs: how a request body is built and how an answer is read.

The built-in ``openai`` format speaks the OpenAI embeddings API for texts (``{"model", "input": [texts],
"encoding_format"}``) and vLLM's multimodal form for images (one image as a ``data:image/png;base64,`` URL in a
chat-style message, ``{"model", "messages": [...], "encoding_format"}``), both ``POST {api_base}/embeddings``. The
other built-in formats (infinity, cohere, voyage, jina) are in tasks/models/api_providers.py.

A format may have a way to say whether a text is a query or a document (:meth:`RequestFormat.options`, given the
role, and the ``dimensions`` asked for); ``roles`` names it, for ``clipcache models --api-formats``.

Other APIs plug in here: subclass :class:`RequestFormat`, override what differs (``text_request``,
``image_request``, ``path``, ``parse``) and register it in ``API_FORMATS`` (``API_FORMATS.register("name",
"pkg.module:FORMAT")``) or through the entry point group ``clipcache.api_formats``; ``--api_format name`` selects
it. The format's name is part of the model's identity (a cache key): two formats may send the same input differently.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np

from clipcache.storage.errors import ConfigError
from clipcache.tasks.registry import Registry


class MalformedResponse(Exception):
    """An answer that is not what the format expects; the message says what was wrong (it becomes a ModelError)."""


class RequestFormat:
    """The OpenAI embeddings API for texts, vLLM's chat-style multimodal input for images."""

    path = "/embeddings"  # appended to api_base
    images_per_request = 1  # vLLM's messages form embeds one image per request
    description = "OpenAI embeddings API for texts (vLLM, TEI, OpenAI); images as vLLM's chat-style messages"
    roles = ""  # how the format says query vs document ("" = it cannot: use --api_query_prefix)
    images = True  # whether the format can send images at all

    def options(self, payload: dict[str, Any], *, role: str | None, dimensions: int | None,
                images: bool) -> dict[str, Any]:
        """``payload`` with the role (``query`` / ``document``; None when roles are off) and the shortened
        dimension (None: the model's own) in the format's fields. OpenAI's API has ``dimensions`` and no role."""
        return payload if dimensions is None else {**payload, "dimensions": dimensions}

    def text_request(self, model: str, texts: list[str], encoding_format: str) -> dict[str, Any]:
        return {"model": model, "input": texts, "encoding_format": encoding_format}

    def image_request(self, model: str, image_urls: list[str], encoding_format: str) -> dict[str, Any]:
        """``image_urls``: ``images_per_request`` data URLs (``data:image/png;base64,...``)."""
        [url] = image_urls
        return {"model": model, "encoding_format": encoding_format,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}

    def parse(self, body: Any, n: int) -> tuple[np.ndarray, int | None]:
        """(the ``n`` vectors as float32 (n, dim) in input order, tokens the server reports or None).

        Reads ``data[i].embedding`` as a list of numbers or as base64 of little-endian float32 (whatever was asked
        for: some servers ignore ``encoding_format``), in the order of ``data[i].index``."""
        if not isinstance(body, dict) or not isinstance(body.get("data"), list):
            raise MalformedResponse("the answer has no 'data' list")
        items = body["data"]
        if len(items) != n:
            raise MalformedResponse(f"{len(items)} embeddings for {n} inputs")
        if not all(isinstance(item, dict) for item in items):
            raise MalformedResponse("an item of 'data' is not an object")
        indices = [item.get("index", i) for i, item in enumerate(items)]
        if not all(type(i) is int for i in indices) or sorted(indices) != list(range(n)):
            raise MalformedResponse(f"'data[].index' is not 0..{n - 1}")
        rows = [decode_vector(item.get("embedding")) for _, item in sorted(zip(indices, items, strict=True),
                                                                              key=lambda pair: pair[0])]
        if len({len(row) for row in rows}) != 1:
            raise MalformedResponse(f"embeddings of different lengths ({sorted({len(row) for row in rows})})")
        return np.stack(rows), reported_tokens(body)


def decode_vector(value: Any) -> np.ndarray:
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as e:
            raise MalformedResponse("an embedding is a string that is not base64") from e
        if not raw or len(raw) % 4:
            raise MalformedResponse(f"a base64 embedding of {len(raw)} bytes is not a float32 vector")
        vector = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    elif isinstance(value, list) and value and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   for x in value):
        vector = np.asarray(value, dtype=np.float32)
    else:
        raise MalformedResponse(f"an embedding is {type(value).__name__}, not a list of numbers or base64 text")
    check_vector(vector)
    return vector


# A vector's L2 norm (float64) must lie in float32's normal range: a zero or denormal vector has no direction, and
# one whose norm overflows float32 (values near 3e38) normalises to zeros in float32 arithmetic.
MIN_NORM = float(np.finfo(np.float32).tiny)
MAX_NORM = float(np.finfo(np.float32).max)


def check_vector(vector: np.ndarray) -> None:
    """MalformedResponse unless every value is finite and the norm, computed in float64, is a finite, non-zero,
    normal float32 number."""
    if not np.isfinite(vector).all():
        raise MalformedResponse("an embedding holds NaN or infinite values")
    if not np.any(vector):
        raise MalformedResponse("an embedding is all zeros")
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    if not MIN_NORM <= norm <= MAX_NORM:
        raise MalformedResponse(f"an embedding's norm {norm:.3g} is outside float32's normal range (denormal or "
                                f"overflowing values)")


MAX_REPORTED_TOKENS = 2 ** 53  # a usage figure above this is not a count (1e300 would overflow every sum)


def reported_tokens(body: dict[str, Any], keys: tuple[str, ...] = ("total_tokens", "prompt_tokens"),
                    block: str = "usage") -> int | None:
    """The token count an answer reports (None when it reports none, or nothing that can be a count)."""
    usage = body.get(block)
    if not isinstance(usage, dict):
        return None
    for key in keys:
        value = usage.get(key)
        if (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and 0 <= value <= MAX_REPORTED_TOKENS):
            return int(value)
    return None


API_FORMATS: Registry[RequestFormat | type[RequestFormat]] = Registry("API request format", ConfigError,
                                                                      entry_point_group="clipcache.api_formats")
API_FORMATS.register("openai", "clipcache.tasks.models.api_formats:RequestFormat")
for _name in ("infinity", "cohere", "voyage", "jina"):
    API_FORMATS.register(_name, f"clipcache.tasks.models.api_providers:{_name.capitalize()}Format")


def get_format(name: str) -> RequestFormat:
    obj = API_FORMATS.get(name)
    if isinstance(obj, type) and issubclass(obj, RequestFormat):
        obj = obj()
    if not isinstance(obj, RequestFormat):
        raise ConfigError(f"API request format {name!r} ({API_FORMATS.origin(name)}) is not a RequestFormat (got "
                          f"{type(obj).__name__})")
    return obj


def format_rows() -> list[tuple[str, str, str, str]]:
    """(name, what it sends, its role mechanism, where it comes from) of every registered format."""
    from rich.markup import escape

    rows = []
    for name in API_FORMATS.names():
        try:
            fmt = get_format(name)
            what, roles = fmt.description, fmt.roles or "none: --api_query_prefix / --api_document_prefix"
        except Exception as e:  # a broken plugin is listed with its problem, not hidden
            what, roles = f"cannot be used: {e}", ""
        rows.append((name, escape(what), escape(roles), API_FORMATS.origin(name)))
    return rows
