"""The loaded ``glossary_clip`` model: clipcache's open_clip model with translated texts."""

from __future__ import annotations

import torch

from clipcache.tasks.models.open_clip_model import OpenClipModel
from clipcache_plugin_example.loader import translate


class GlossaryClipModel(OpenClipModel):
    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return super().tokenize([translate(text) for text in texts])
