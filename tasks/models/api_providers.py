"""The built-in request formats besides ``openai``, as each provider's public API reference defines them.

- ``infinity`` (michaelfeil/infinity's OpenAI-compatible server): ``POST /embeddings`` with ``{"model", "input":
  [texts or image data URLs], "encoding_format", "modality": "text" | "image"}``, several images a request; answers
  as OpenAI's. No role field (use ``--api_query_prefix``).
- ``cohere`` (Cohere's embed API v2, ``api_base`` https://api.cohere.com/v2): ``POST /embed`` with ``{"model",
  "texts": [...], "input_type", "embedding_types": ["float"]}`` or ``{"model", "images": [one data URL],
  "input_type": "image", ...}``; ``input_type`` is ``search_query`` for queries and ``search_document`` for documents
  (``search_document`` for both with ``--api_roles off``); ``output_dimension`` shortens. Answers ``{"embeddings":
  {"float": [[...], ...]}, "meta": {"billed_units": {"input_tokens", "image_tokens"}}}``.
- ``voyage`` (Voyage AI's multimodal embeddings, ``api_base`` https://api.voyageai.com/v1): ``POST
  /multimodalembeddings`` with ``{"model", "inputs": [{"content": [{"type": "text", "text"} | {"type":
  "image_base64", "image_base64": data URL}]}], "input_type": "query" | "document"}`` (left out with ``--api_roles
  off``), ``output_encoding: "base64"`` and ``output_dimension``; answers as OpenAI's (``usage.total_tokens``).
- ``jina`` (Jina AI's embeddings API with image inputs, ``api_base`` https://api.jina.ai/v1): ``POST /embeddings``
  with ``{"model", "input": [{"text"} | {"image": base64}], "task": "retrieval.query" | "retrieval.passage",
  "embedding_type": "float" | "base64", "dimensions"}``; answers as OpenAI's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clipcache.tasks.models.api_formats import MalformedResponse, RequestFormat, decode_vector, reported_tokens


class InfinityFormat(RequestFormat):
    description = "infinity-emb: OpenAI embeddings with \"modality\": text | image, images as data URLs"
    images_per_request = 8

    def text_request(self, model: str, texts: list[str], encoding_format: str) -> dict[str, Any]:
        return {"model": model, "input": texts, "encoding_format": encoding_format, "modality": "text"}

    def image_request(self, model: str, image_urls: list[str], encoding_format: str) -> dict[str, Any]:
        return {"model": model, "input": image_urls, "encoding_format": encoding_format, "modality": "image"}


class CohereFormat(RequestFormat):
    path = "/embed"
    description = "Cohere embed v2 (api_base .../v2): texts or one image, input_type, embeddings.float"
    roles = "input_type search_query / search_document"
    COHERE_ROLES = {"query": "search_query", "document": "search_document", None: "search_document"}

    def text_request(self, model: str, texts: list[str], encoding_format: str) -> dict[str, Any]:
        return {"model": model, "texts": texts, "input_type": "search_document", "embedding_types": ["float"]}

    def image_request(self, model: str, image_urls: list[str], encoding_format: str) -> dict[str, Any]:
        return {"model": model, "images": image_urls, "input_type": "image", "embedding_types": ["float"]}

    def options(self, payload: dict[str, Any], *, role: str | None, dimensions: int | None,
                images: bool) -> dict[str, Any]:
        payload = dict(payload)
        if not images:
            payload["input_type"] = self.COHERE_ROLES[role]
        if dimensions is not None:
            payload["output_dimension"] = dimensions
        return payload

    def parse(self, body: Any, n: int) -> tuple[np.ndarray, int | None]:
        embeddings = body.get("embeddings") if isinstance(body, dict) else None
        rows = embeddings.get("float") if isinstance(embeddings, dict) else None
        if not isinstance(rows, list):
            raise MalformedResponse("the answer has no 'embeddings.float' list")
        if len(rows) != n:
            raise MalformedResponse(f"{len(rows)} embeddings for {n} inputs")
        vectors = [decode_vector(row) for row in rows]
        if len({len(v) for v in vectors}) != 1:
            raise MalformedResponse(f"embeddings of different lengths ({sorted({len(v) for v in vectors})})")
        meta = body.get("meta")
        units = meta.get("billed_units") if isinstance(meta, dict) else None
        tokens = None
        if isinstance(units, dict):
            parts = [reported_tokens({"u": units}, (key,), "u") for key in ("input_tokens", "image_tokens")]
            tokens = None if all(p is None for p in parts) else sum(p or 0 for p in parts)
        return np.stack(vectors), tokens


class VoyageFormat(RequestFormat):
    path = "/multimodalembeddings"
    description = "Voyage AI multimodal embeddings: inputs[].content of text / image_base64 parts"
    roles = "input_type query / document"
    images_per_request = 8

    @staticmethod
    def _request(model: str, parts: list[dict[str, str]], encoding_format: str) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": model, "inputs": [{"content": [part]} for part in parts]}
        if encoding_format == "base64":
            payload["output_encoding"] = "base64"
        return payload

    def text_request(self, model: str, texts: list[str], encoding_format: str) -> dict[str, Any]:
        return self._request(model, [{"type": "text", "text": t} for t in texts], encoding_format)

    def image_request(self, model: str, image_urls: list[str], encoding_format: str) -> dict[str, Any]:
        return self._request(model, [{"type": "image_base64", "image_base64": u} for u in image_urls],
                             encoding_format)

    def options(self, payload: dict[str, Any], *, role: str | None, dimensions: int | None,
                images: bool) -> dict[str, Any]:
        payload = dict(payload)
        if role is not None:
            payload["input_type"] = role
        if dimensions is not None:
            payload["output_dimension"] = dimensions
        return payload


class JinaFormat(RequestFormat):
    description = "Jina AI embeddings: input of {text} / {image: base64} items, task, embedding_type"
    roles = "task retrieval.query / retrieval.passage"
    images_per_request = 8
    JINA_TASKS = {"query": "retrieval.query", "document": "retrieval.passage"}

    def text_request(self, model: str, texts: list[str], encoding_format: str) -> dict[str, Any]:
        return {"model": model, "input": [{"text": t} for t in texts], "embedding_type": encoding_format}

    def image_request(self, model: str, image_urls: list[str], encoding_format: str) -> dict[str, Any]:
        return {"model": model, "input": [{"image": u.split(",", 1)[1]} for u in image_urls],
                "embedding_type": encoding_format}

    def options(self, payload: dict[str, Any], *, role: str | None, dimensions: int | None,
                images: bool) -> dict[str, Any]:
        payload = dict(payload)
        if role is not None:
            payload["task"] = self.JINA_TASKS[role]
        if dimensions is not None:
            payload["dimensions"] = dimensions
        return payload
