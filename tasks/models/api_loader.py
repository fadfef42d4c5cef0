"""Embedding models behind an HTTP API: ``api:<model id> --api_base URL`` (vLLM pooling models behind its
OpenAI-compatible server, commercial embedding APIs).

Identity (the cache key) is the endpoint's model id, the revision the user declares (``--api_revision``, default
today's UTC date), the request format and what else changes the vectors (roles off, query / document prefixes,
``--api_dimensions``); not the URL and not the key: the same model behind two URLs is the same
model. Whether the model behind a name is still the one the cache holds is checked by canaries when it is loaded
(tasks/models/api_canaries.py). Resolution touches no network (except ``--api_format auto``, which reads the
server's model listing once) and imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clipcache.storage.errors import ModelError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.api_spec import API_PREFIX, ApiSettings, today_revision
from clipcache.tasks.models.loader import ModelLoader, ResolvedModel
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from clipcache.tasks.models.base import EmbeddingModel

CANARY_FOLDER = "api_canaries"


def identity_options(settings: ApiSettings) -> dict[str, object]:
    """What changes the vectors besides model, revision and format: the roles (when the format sends one and they are
    off), the prefixes and the dimensions; only those set, so identities (cache keys) of runs without them stay."""
    from clipcache.tasks.models.api_formats import get_format

    options: dict[str, object] = {}
    if not settings.roles and get_format(settings.request_format).roles:
        options["roles"] = "off"
    if settings.query_prefix:
        options["query_prefix"] = settings.query_prefix
    if settings.document_prefix:
        options["document_prefix"] = settings.document_prefix
    if settings.dimensions is not None:
        options["dimensions"] = settings.dimensions
    return options


@dataclass(frozen=True)
class ApiResolvedModel(ResolvedModel):
    settings: ApiSettings = ApiSettings(api_base="")  # how to reach it: not part of the identity
    canary_dir: str | None = None  # <cache>/api_canaries: where its canary answers are recorded

    @property
    def text_roles(self) -> bool:
        """A query and a document are sent differently: by the format's role (Cohere, Voyage and Jina name one,
        unless --api_roles off) or by different prefixes (``--api_query_prefix`` / ``--api_document_prefix``)."""
        from clipcache.tasks.models.api_formats import get_format

        settings = self.settings
        sends_role = settings.roles and bool(get_format(settings.request_format).roles)
        return sends_role or settings.query_prefix != settings.document_prefix


class ApiLoader(ModelLoader):
    name = "api"
    description = ("embedding models behind an OpenAI-compatible HTTP API (vLLM, hosted APIs): api:MODEL_ID "
                   "--api_base URL (see docs/api_models.md)")
    priority = 5  # the api: prefix is unambiguous

    def claims(self, spec: ModelSpec) -> bool:
        return spec.model_name.startswith(API_PREFIX)

    def resolve(self, spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None) -> ApiResolvedModel:
        model_id = spec.model_name.removeprefix(API_PREFIX)
        if not model_id.strip():
            raise ModelError(f"model {spec.model_name!r}: expected api:<model id>, the name the API serves it under")
        if not spec.api_base:
            raise ModelError(f"model {spec.model_name!r}: --api_base is required (e.g. http://localhost:8000/v1)")
        settings = ApiSettings.from_fields(spec)
        if settings.request_format == "auto":  # chosen once, here, and recorded in the identity
            from dataclasses import replace

            from clipcache.tasks.models.api_client import detect_format

            settings = replace(settings, request_format=detect_format(settings, model_id, f"api model {model_id!r}"))
        revision = spec.api_revision or today_revision()
        identity = {"loader": "api", "model": model_id, "api_revision": revision,
                    "request_format": settings.request_format, **identity_options(settings)}
        # The canaries live beside the cache's file-hash memo: <cache_dir>/api_canaries (a local folder for a URL).
        canary_dir = str(memo.memo_path.parent / CANARY_FOLDER) if memo.memo_path is not None else None
        return ApiResolvedModel("api", model_id, None, revision, identity, f"api:{model_id}@{revision}", revision,
                                settings=settings, canary_dir=canary_dir)

    def load(self, resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None) -> EmbeddingModel:
        from clipcache.tasks.models.api_model import ApiEmbeddingModel

        if not isinstance(resolved, ApiResolvedModel):
            raise ModelError(f"model {resolved.source!r} was not resolved by the api loader")
        return ApiEmbeddingModel(resolved, device)


LOADER = ApiLoader()
