"""Model loaders, in a registry that third-party packages extend with an entry point (group ``clipcache.models``).

``resolve_model`` turns a :class:`ModelSpec` into a load-free identity (for cache keys and results); ``load_model``
builds the torch model only when something actually needs encoding. See tasks/models/loader.py for the contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clipcache.storage.errors import ModelError
from clipcache.tasks.registry import Registry

if TYPE_CHECKING:  # the loaders import ModelSpec, whose validator reads this registry: no import circle at run time
    from clipcache.tasks.models.loader import ModelLoader

LOADERS: Registry[ModelLoader] = Registry("model type", ModelError, entry_point_group="clipcache.models")
LOADERS.register("open_clip", "clipcache.tasks.models.open_clip_loader:LOADER")
LOADERS.register("hf", "clipcache.tasks.models.hf_loader:LOADER")
LOADERS.register("modelscope", "clipcache.tasks.models.hf_loader:MODELSCOPE")
LOADERS.register("sentence_transformers", "clipcache.tasks.models.st_loader:LOADER")
LOADERS.register("api", "clipcache.tasks.models.api_loader:LOADER")
LOADERS.register("internvl", "clipcache.tasks.models.internvl_loader:LOADER")
