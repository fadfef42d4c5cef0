"""The settings of an embedding model behind an HTTP API (``api:<model id>``), as validated fields.

:class:`ApiFields` holds them for :class:`~clipcache.tasks.models.spec.ModelSpec` (and evalscope model entries, and
the CLI's ``--api_*`` flags, which are generated from it); :class:`ApiSettings` is what the loader hands the model,
with the defaults filled in. Light on purpose: pydantic only, since naming and validating a model imports nothing
heavy. The API key is never a field: only the name of the environment variable that holds it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

API_PREFIX = "api:"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
EncodingFormat = Literal["float", "base64"]
OnOff = Literal["on", "off"]
Truncate = Literal["error", "warn"]

# User names and passwords given in an --api_base URL (http://user:pw@host/v1), by the URL without them: they are
# stripped when the field is validated, so no parameter, run row, log line or message ever holds them, and live only
# in this process's memory for its requests (a deployment's worker in another process does not get them).
_URL_CREDENTIALS: dict[str, tuple[str, str]] = {}
_URL_LOCK = threading.Lock()


def strip_credentials(url: str) -> str:
    """``url`` without ``user:password@``; the credentials are kept in memory for :func:`url_credentials`."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    with _URL_LOCK:
        _URL_CREDENTIALS[bare.rstrip("/")] = (unquote(user), unquote(password))
    return bare


def url_credentials(api_base: str) -> tuple[str, str] | None:
    with _URL_LOCK:
        return _URL_CREDENTIALS.get(api_base.rstrip("/"))


def is_api_model(model_name: str, model_type: str) -> bool:
    return model_type == "api" or (model_type == "auto" and model_name.startswith(API_PREFIX))


def today_revision() -> str:
    """The default ``api_revision``: today's date (UTC), so an unpinned run never mixes two days' models."""
    return datetime.now(UTC).strftime("%Y-%m-%d")


class ApiFields(BaseModel):
    """Per-model settings of ``api:`` models; all unset for other models (the defaults live in ApiSettings)."""

    api_base: str | None = Field(None, description="api: models: the OpenAI-compatible base URL, e.g. "
                                                    "http://localhost:8000/v1 (POST {api_base}/embeddings); not part "
                                                    "of the cache key")
    api_key_env: str | None = Field(None, description=f"api: models: the environment variable holding the API key "
                                                      f"(default {DEFAULT_KEY_ENV}); the key is never written anywhere")
    api_revision: str | None = Field(None, description="api: models: the model version you declare, part of the "
                                                       "cache key (default: today's date, UTC, YYYY-MM-DD)")
    api_format: str | None = Field(None, description="api: models: request format (clipcache models --api-formats): "
                                                     "openai (default: texts as input, images as vLLM chat-style "
                                                     "messages), infinity, cohere, voyage, jina, a plugin's, or auto "
                                                     "(asks the server's model listing)")
    api_query_prefix: str | None = Field(None, description="api: models: text put before every query (retrieval "
                                                           "queries), e.g. a model's query instruction; part of the "
                                                           "cache key")
    api_document_prefix: str | None = Field(None, description="api: models: text put before every document (corpus "
                                                              "texts, captions, class prompts); part of the cache key")
    api_roles: OnOff | None = Field(None, description="api: models: send the format's query/document role (Cohere "
                                                      "input_type, Voyage input_type, Jina task); default on; part "
                                                      "of the cache key")
    api_dimensions: PositiveInt | None = Field(None, description="api: models: ask for shortened embeddings of this "
                                                                 "many dimensions (OpenAI 'dimensions'); part of "
                                                                 "the cache key")
    api_tokenizer: str | None = Field(None, description="api: models: a local tokenizer.json (or its folder) of the "
                                                        "model, to count text tokens locally for the cost line and "
                                                        "--api_tpm (default: an estimate, 4 characters a token)")
    api_max_tokens: PositiveInt | None = Field(None, description="api: models: the longest text the server embeds "
                                                                 "whole, in tokens (default: what its model listing "
                                                                 "declares, if it does); longer texts: --api_truncate")
    api_truncate: Truncate | None = Field(None, description="api: models: a text longer than the server's declared "
                                                            "maximum stops the run (error, default) or is logged and "
                                                            "sent (warn: the server truncates it)")
    api_encoding_format: EncodingFormat | None = Field(None, description="api: models: float or base64 (default; "
                                                                         "little-endian float32, exact)")
    api_concurrency: PositiveInt | None = Field(None, description="api: models: requests in flight (default 8)")
    api_rpm: PositiveFloat | None = Field(None, description="api: models: at most this many requests per minute")
    api_tpm: PositiveInt | None = Field(None, description="api: models: at most this many tokens per minute "
                                                          "(estimated before each request, corrected by the usage "
                                                          "the server reports)")
    api_timeout: PositiveFloat | None = Field(None, description="api: models: seconds to wait for one answer "
                                                                "(default 60)")
    api_max_retries: NonNegativeInt | None = Field(None, description="api: models: retries of a request after a "
                                                                     "timeout, connection error, 408, 429 or 5xx "
                                                                     "(default 5)")
    price_per_1k: NonNegativeFloat | None = Field(None, description="api: models: price per 1,000 tokens, for the "
                                                                    "estimated cost in the run's cost line")

    @field_validator("api_base")
    @classmethod
    def _no_credentials_kept(cls, value: str | None) -> str | None:
        return None if value is None else strip_credentials(value)

    @field_validator("api_query_prefix", "api_document_prefix")
    @classmethod
    def _printable_prefix(cls, value: str | None) -> str | None:
        if value is not None and any(ord(ch) < 32 and ch not in "\n\t" or ord(ch) == 127 for ch in value):
            raise ValueError("holds a control character")
        return value

    @model_validator(mode="after")
    def _api_fields_fit(self) -> Any:
        name, model_type = getattr(self, "model_name", ""), getattr(self, "model_type", "auto")
        given = [f for f in ApiFields.model_fields if getattr(self, f) is not None]
        if not is_api_model(name, model_type):
            if given:
                raise ValueError(f"{given[0]}: only api: models take it (model {name!r} is not one; name it "
                                 f"api:<model id>)")
            return self
        if self.api_base is None:
            raise ValueError(f"api_base: model {name!r} needs the server's OpenAI-compatible base URL "
                             f"(--api_base http://HOST:PORT/v1)")
        if not re.match(r"https?://[^\s/]+", self.api_base):
            raise ValueError(f"api_base: expected an http:// or https:// URL, got {self.api_base!r}")
        if self.api_revision is not None and not REVISION.fullmatch(self.api_revision):
            raise ValueError(f"api_revision: {self.api_revision!r} is not a plain version name (letters, digits, "
                             f"'.', '-', '_'; e.g. 2025-06-01 or v2)")
        if self.api_key_env is not None and not ENV_NAME.fullmatch(self.api_key_env):
            raise ValueError("api_key_env: expected the NAME of an environment variable (e.g. MY_API_KEY), got "
                             "something else; never put the key itself in a flag or a config")
        if self.api_format is not None:
            from clipcache.tasks.models.api_formats import API_FORMATS

            if self.api_format != "auto" and self.api_format not in API_FORMATS:
                raise ValueError(f"api_format: unknown request format {self.api_format!r} (known: "
                                 f"{', '.join(API_FORMATS.names())}){API_FORMATS.suggest(self.api_format)}")
        return self


@dataclass(frozen=True)
class ApiSettings:
    """What an API model needs besides its identity; never part of a cache key, and never holds the key."""

    api_base: str
    key_env: str = DEFAULT_KEY_ENV
    request_format: str = "openai"
    encoding_format: EncodingFormat = "base64"
    concurrency: int = 8
    rpm: float | None = None
    tpm: int | None = None
    timeout: float = 60.0
    max_retries: int = 5
    price_per_1k: float | None = None
    query_prefix: str = ""
    document_prefix: str = ""
    roles: bool = True
    dimensions: int | None = None
    tokenizer: str | None = None
    max_tokens: int | None = None
    truncate: Truncate = "error"
    backoff_seconds: float = 0.5
    backoff_cap_seconds: float = 30.0

    @classmethod
    def from_fields(cls, fields: ApiFields) -> ApiSettings:
        given: dict[str, Any] = {
            "api_base": (fields.api_base or "").rstrip("/"), "key_env": fields.api_key_env,
            "request_format": fields.api_format, "encoding_format": fields.api_encoding_format,
            "concurrency": fields.api_concurrency, "rpm": fields.api_rpm, "tpm": fields.api_tpm,
            "timeout": fields.api_timeout, "max_retries": fields.api_max_retries, "price_per_1k": fields.price_per_1k,
            "query_prefix": fields.api_query_prefix, "document_prefix": fields.api_document_prefix,
            "roles": None if fields.api_roles is None else fields.api_roles == "on",
            "dimensions": fields.api_dimensions, "tokenizer": fields.api_tokenizer,
            "max_tokens": fields.api_max_tokens, "truncate": fields.api_truncate}
        return cls(**{k: v for k, v in given.items() if v is not None})


def api_fields_for(names: list[str], model_type: str, given: dict[str, Any]) -> list[dict[str, Any]]:
    """The CLI's ``--api_*`` values for each of ``names`` (clip_benchmark's product may mix API and local models:
    only API models get them); given for none of them is an error, not silently ignored."""
    given = {k: v for k, v in given.items() if k in ApiFields.model_fields and v is not None}
    flags = [is_api_model(name, model_type) for name in names]
    if given and not any(flags):
        from clipcache.storage.errors import ConfigError

        raise ConfigError(f"--{next(iter(given))}: only api: models take it (name one as --model api:<model id>)")
    return [dict(given) if api else {} for api in flags]
