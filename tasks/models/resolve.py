"""From a :class:`ModelSpec` to its loader, its load-free identity, and (on demand) the loaded model.

``model_type auto`` asks the registered loaders in priority order whether they claim the name (modelscope ids when the
hub is ModelScope, bundled text models, open_clip names and folders, transformers ids and folders, then plugins).
A plugin loader that cannot be imported is left out of that search (it is named in the error if nothing claims the
model), so one broken package does not stop the evaluation of models it was never going to load.
"""

from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from clipcache.storage.errors import ModelError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models import LOADERS
from clipcache.tasks.models.loader import ModelLoader, ResolvedModel
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from clipcache.tasks.models.base import EmbeddingModel


log = logging.getLogger("clipcache.models")
_warned: set[str] = set()


def get_loader(name: str) -> ModelLoader:
    """The registered loader ``name``; a plugin's entry point may name a ModelLoader instance or its class."""
    obj = LOADERS.get(name)
    if isinstance(obj, type) and issubclass(obj, ModelLoader):
        obj = obj()
    if not isinstance(obj, ModelLoader):
        raise ModelError(f"model type {name!r} ({LOADERS.origin(name)}) is not a ModelLoader (got "
                         f"{type(obj).__name__}); an entry point in clipcache.models must name a ModelLoader "
                         f"instance or subclass")
    return obj


def _importable() -> tuple[list[ModelLoader], list[str]]:
    loaders, broken = [], []
    for name in LOADERS.names():
        try:
            loaders.append(get_loader(name))
        except ModelError as e:
            broken.append(str(e))
    return sorted(loaders, key=lambda loader: (loader.priority, loader.name)), broken


def loaders_by_priority() -> list[ModelLoader]:
    return _importable()[0]


def known_names() -> list[str]:
    return sorted({name for loader in loaders_by_priority() for name in loader.known_names()})


def _unknown(spec: ModelSpec, broken: list[str]) -> ModelError:
    close = difflib.get_close_matches(spec.model_name, known_names(), n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else (
        " Expected an open_clip architecture (see `clipcache models`), local-dir:PATH, hf-hub:ORG/REPO, "
        "a Hugging Face / ModelScope id ORG/NAME, or a local model directory.")
    skipped = f" (Not asked: {'; '.join(broken)})" if broken else ""
    return ModelError(f"Unknown model {spec.model_name!r}.{hint}{skipped}")


def _check_local(spec: ModelSpec) -> None:
    """evalscope's ``hub: local``: the name is a folder on this machine, whatever loader reads it."""
    if spec.hub == "local" and not Path(spec.bare_name).expanduser().exists():
        raise ModelError(f"model {spec.model_name!r}: hub 'local' means a local folder, and "
                         f"{Path(spec.bare_name).expanduser()} does not exist")


def loader_for(spec: ModelSpec) -> ModelLoader:
    """The loader ``spec`` names, or (auto) the first that claims it; a "Did you mean" error if none does.
    Cheap: imports no torch and touches no network, so names are checked before any work starts."""
    _check_local(spec)
    if spec.model_type != "auto":
        return get_loader(spec.model_type)
    loaders, broken = _importable()
    for message in broken:
        if message not in _warned:
            _warned.add(message)
            log.warning("model loader left out: %s", message)
    for loader in loaders:
        if loader.claims(spec):
            return loader
    raise _unknown(spec, broken)


def resolve_model(spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None = None) -> ResolvedModel:
    loader = loader_for(spec)
    if spec.trust_remote_code and not loader.runs_remote_code:
        raise ModelError(f"model {spec.model_name!r}: trust_remote_code is for the loaders that run a model "
                         f"folder's own code (--model_type internvl); the {loader.name} loader never runs it")
    return loader.resolve(spec, memo, model_cache_dir)


def load_model(resolved: ResolvedModel, device: torch.device, amp: bool,
               cache_dir: str | None = None) -> EmbeddingModel:
    return get_loader(resolved.loader).load(resolved, device, amp, cache_dir)
