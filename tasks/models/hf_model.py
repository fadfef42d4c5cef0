"""A Hugging Face transformers CLIP-family model in memory: CLIPModel, ChineseCLIPModel, SiglipModel (AutoModel)."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import torch
from PIL import Image

from clipcache.storage.errors import ModelError
from clipcache.tasks.models.base import TwoTowerModel, pooled
from clipcache.tasks.models.custom_code import check_hf_source, checkpoint_refusal, no_prompts, one_line
from clipcache.tasks.models.hf_loader import is_siglip2
from clipcache.tasks.models.loader import ResolvedModel

SUPPORTED_TYPES = ("clip", "chinese_clip", "siglip", "siglip2", "altclip")
log = logging.getLogger("clipcache.models")


class HFImageTransform:
    """Picklable wrapper around an image processor (runs in DataLoader workers)."""

    def __init__(self, processor: Any):
        self.processor = processor

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0]


class NaFlexImageTransform:
    """SigLIP 2 NaFlex (model type ``siglip2``): its processor resizes each image to a patch grid of its own (aspect
    ratio kept, at most ``max_num_patches`` patches) and pads the patch sequence. The three inputs the model needs
    travel as one (P + 1, D + 1) tensor, so batches stack as any model's do: rows 0..P-1 hold a patch's D pixel values
    and its mask bit, row P the grid's height and width (small integers: exact in float32)."""

    def __init__(self, processor: Any):
        self.processor = processor

    def __call__(self, image: Image.Image) -> torch.Tensor:
        out = self.processor(images=image, return_tensors="pt")
        pixels, mask, grid = out["pixel_values"][0], out["pixel_attention_mask"][0], out["spatial_shapes"][0]
        packed = torch.zeros(pixels.shape[0] + 1, pixels.shape[1] + 1, dtype=torch.float32)
        packed[:-1, :-1] = pixels
        packed[:-1, -1] = mask.float()
        packed[-1, :2] = grid.float()
        return packed


def naflex_inputs(packed: torch.Tensor) -> dict[str, torch.Tensor]:
    """A batch of :class:`NaFlexImageTransform` tensors -> Siglip2Model's image inputs."""
    return {"pixel_values": packed[:, :-1, :-1], "pixel_attention_mask": packed[:, :-1, -1].round().to(torch.int32),
            "spatial_shapes": packed[:, -1, :2].round().to(torch.long)}


class HFClipModel(TwoTowerModel):
    def __init__(self, resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None):
        from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer

        source, revision = resolved.source, resolved.revision
        # trust_remote_code=False: a repo's own modules (its config's auto_map) are never imported, and never asked for
        kwargs = {"revision": revision, "cache_dir": cache_dir, "trust_remote_code": False}
        try:
            with no_prompts():
                check_hf_source(source, revision=revision, cache_dir=cache_dir)
                config = AutoConfig.from_pretrained(source, **kwargs)
                if config.model_type not in SUPPORTED_TYPES:
                    raise ModelError(f"{source!r} is a {config.model_type!r} model; supported Hugging Face model "
                                     f"types: {', '.join(SUPPORTED_TYPES)}")
                module = AutoModel.from_pretrained(source, dtype=torch.float32, **kwargs)
                self.tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
                self.processor = AutoImageProcessor.from_pretrained(source, **kwargs)
        except ModelError:
            raise
        except pickle.UnpicklingError as e:  # a .bin/.pth weights file that torch's weights_only loader refused
            raise checkpoint_refusal(source, e) from e
        except Exception as e:  # transformers raises OSError/ValueError/HTTP errors for missing or bad files
            raise ModelError(f"could not load Hugging Face model {source!r}: {type(e).__name__}: "
                             f"{one_line(e)}") from e
        self.model_type = config.model_type
        text_cfg = getattr(config, "text_config", config)
        self.max_length = int(getattr(text_cfg, "max_position_embeddings", 77))
        # The text rule is the identity's (so a cache key always says how its text vectors were made): SigLIP 2 is
        # lowercased, as big_vision does; hf_loader.text_preprocessing decides it when resolving.
        self.lowercase = bool(resolved.identity.get("text_preprocessing", {}).get("lowercase"))
        if is_siglip2(config.model_type, type(self.tokenizer).__name__) and not self.lowercase:
            log.warning("%s looks like SigLIP 2 (a Gemma tokenizer) but its name does not say siglip2: its texts are "
                        "not lowercased as big_vision does; load it from a local folder to have them lowercased",
                        source)
        self.naflex = config.model_type == "siglip2"
        self.transform: Any = NaFlexImageTransform(self.processor) if self.naflex else HFImageTransform(self.processor)
        super().__init__(module, device, amp)

    def image_transform(self, image: Image.Image) -> torch.Tensor:
        return self.transform(image)

    def portable_image_transform(self) -> Any:
        return self.transform

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        if self.lowercase:  # big_vision lowercases SigLIP 2's texts; HF's Gemma tokenizer keeps case
            texts = [t.lower() for t in texts]
        # SigLIP was trained with fixed-length padding and pools the last token: it must be padded to max_length.
        padding = "max_length" if self.model_type.startswith("siglip") else True
        tokens = self.tokenizer(texts, padding=padding, truncation=True, max_length=self.max_length,
                                return_tensors="pt")
        return dict(tokens)

    def _encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.naflex:
            return pooled(self.module.get_image_features(**naflex_inputs(pixels)))
        return pooled(self.module.get_image_features(pixel_values=pixels))

    def _encode_text(self, tokens: dict[str, torch.Tensor]) -> torch.Tensor:
        return pooled(self.module.get_text_features(**tokens))
