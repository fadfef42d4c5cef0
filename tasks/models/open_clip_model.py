"""An open_clip model in memory (imports torch and open_clip; loaded only when something must be encoded)."""

from __future__ import annotations

import torch
from PIL import Image

from clipcache.storage.errors import ModelError
from clipcache.tasks.models.base import TwoTowerModel
from clipcache.tasks.models.loader import RANDOM_INIT_SEED, ResolvedModel


class OpenClipModel(TwoTowerModel):
    def __init__(self, resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None):
        import open_clip

        name, pretrained = resolved.source, resolved.pretrained
        if resolved.arch_config:
            open_clip.add_model_config(resolved.arch_config)
        if pretrained is None and not name.startswith(("local-dir:", "hf-hub:")):
            torch.manual_seed(RANDOM_INIT_SEED)  # random weights must be reproducible: they are part of the key
        try:
            module, _, transform = open_clip.create_model_and_transforms(
                name, pretrained=pretrained, cache_dir=cache_dir, device="cpu")
            self.tokenizer = open_clip.get_tokenizer(name, cache_dir=cache_dir)
        except Exception as e:  # open_clip raises RuntimeError/ValueError/OSError/HTTP errors for the same problem
            raise ModelError(f"could not load open_clip model {name!r} (pretrained={pretrained!r}): "
                             f"{type(e).__name__}: {e}") from e
        self.transform = transform
        super().__init__(module, device, amp)

    def image_transform(self, image: Image.Image) -> torch.Tensor:
        return self.transform(image)

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return self.tokenizer(texts)

    def _encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.module.encode_image(pixels)

    def _encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.module.encode_text(tokens)
