"""From a :class:`ModelSpec` to its loader, its load-free identity, and (on demand) the loaded model.

``model_type auto`` asks the registered loaders in priority order whether they claim the name (modelscope ids when the
hub is ModelScope, bundled text models, open_clip names and folders, transformers ids and folders, then plugins).
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from clipcache.storage.errors import ModelError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models import LOADERS
from clipcache.tasks.models.loader import ModelLoader, ResolvedModel
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from clipcache.tasks.models.base import EmbeddingModel


def loaders_by_priority() -> list[ModelLoader]:
    return sorted((loader for _, loader in LOADERS.items()), key=lambda loader: (loader.priority, loader.name))


def known_names() -> list[str]:
    return sorted({name for loader in loaders_by_priority() for name in loader.known_names()})


def _unknown(spec: ModelSpec) -> ModelError:
    close = difflib.get_close_matches(spec.model_name, known_names(), n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else (
        " Expected an open_clip architecture (see `clipcache models`), local-dir:PATH, hf-hub:ORG/REPO, "
        "a Hugging Face / ModelScope id ORG/NAME, or a local model directory.")
    return ModelError(f"Unknown model {spec.model_name!r}.{hint}")


def loader_for(spec: ModelSpec) -> ModelLoader:
    """The loader ``spec`` names, or (auto) the first that claims it; a "Did you mean" error if none does.
    Cheap: imports no torch and touches no network, so names are checked before any work starts."""
    if spec.model_type != "auto":
        return LOADERS.get(spec.model_type)
    for loader in loaders_by_priority():
        if loader.claims(spec):
            return loader
    raise _unknown(spec)


def resolve_model(spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None = None) -> ResolvedModel:
    return loader_for(spec).resolve(spec, memo, model_cache_dir)


def load_model(resolved: ResolvedModel, device: torch.device, amp: bool,
               cache_dir: str | None = None) -> EmbeddingModel:
    return LOADERS.get(resolved.loader).load(resolved, device, amp, cache_dir)
