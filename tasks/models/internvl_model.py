"""InternVL-C / InternVL-G in memory, through the model's documented public interface (the model card of
``OpenGVLab/InternVL-14B-224px``): ``encode_image(pixel_values, mode=...)``, ``encode_text(input_ids)``, the folder's
CLIPImageProcessor and its slow Llama tokenizer. See internvl_loader.py for the rules and the opt-in.

Precision: fp32 by default (14B parameters: ~56 GB of weights, one 80 GB GPU). With ``--amp`` the weights load in
the autocast dtype (fp16 on CUDA, as InternVL's fork loads them; bf16 on a CPU): ~28 GB.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from clipcache.storage.errors import ModelError
from clipcache.tasks.models.base import TwoTowerModel
from clipcache.tasks.models.custom_code import checkpoint_refusal, code_files, local_auto_map, no_prompts, one_line
from clipcache.tasks.models.loader import ResolvedModel


class InternVLImageTransform:
    """Picklable: the folder's image processor, for retrieval told to resize the whole image to the square input
    (InternVL's fork resizes retrieval images to (S, S) and centre-crops classification ones)."""

    def __init__(self, processor: Any, rule: str):
        self.processor = processor
        crop = getattr(processor, "crop_size", None) or {}
        size = crop.get("height") or (processor.size or {}).get("shortest_edge") or 224
        self.overrides: dict[str, Any] = ({"do_center_crop": False, "size": {"height": size, "width": size}}
                                          if rule == "retrieval" else {})

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.processor(images=image, return_tensors="pt", **self.overrides)["pixel_values"][0]


class InternVLClipModel(TwoTowerModel):
    def __init__(self, resolved: ResolvedModel, device: torch.device, amp: bool):
        from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

        identity = resolved.identity
        folder = Path(resolved.source)
        if identity.get("trust_remote_code") is not True:
            raise ModelError(f"{folder}: InternVL's code runs only with trust_remote_code")
        # The code that runs is the code that was hashed: a file changed since resolving would make vectors the
        # identity does not describe.
        local_auto_map(folder)
        if code_files(folder) != identity["code_files"]:
            raise ModelError(f"{folder}: its Python files changed after the run started; run it again")
        self.mode, self.text = identity["mode"], identity["text_preprocessing"]
        self.dtype = (torch.float16 if device.type == "cuda" else torch.bfloat16) if amp else torch.float32
        try:
            with no_prompts():
                module = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=self.dtype,
                                                   local_files_only=True)
                # the tokenizer and processor are plain transformers classes: no code of the folder for them
                self.tokenizer = AutoTokenizer.from_pretrained(
                    folder, use_fast=False, add_bos_token=self.text["add_bos_token"],
                    add_eos_token=self.text["add_eos_token"], padding_side=self.text["padding_side"],
                    trust_remote_code=False, local_files_only=True)
                processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=False,
                                                               local_files_only=True)
        except ModelError:
            raise
        except pickle.UnpicklingError as e:
            raise checkpoint_refusal(folder, e) from e
        except Exception as e:  # transformers raises OSError/ValueError/ImportError for missing or bad files
            raise ModelError(f"could not load InternVL from {folder}: {type(e).__name__}: {one_line(e)}") from e
        for method in ("encode_image", "encode_text"):
            if not callable(getattr(module, method, None)):
                raise ModelError(f"{folder}: its model class {type(module).__name__} has no {method}() (not "
                                 f"InternVL-C/G's interface)")
        # InternVL's encode_text takes ids > 0 as text and pools the last one: pad with 0, on the right
        self.tokenizer.pad_token_id = self.text["pad_token_id"]
        self.transform = InternVLImageTransform(processor, identity["image_rule"])
        super().__init__(module, device, amp)

    def image_transform(self, image: Image.Image) -> torch.Tensor:
        return self.transform(image)

    def portable_image_transform(self) -> Any:
        return self.transform

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        tokens = self.tokenizer([self.text["prefix"] + t for t in texts], return_tensors="pt",
                                max_length=self.text["max_length"], truncation=True, padding=self.text["padding"])
        return tokens["input_ids"]

    def _encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.module.encode_image(pixels.to(self.dtype), mode=self.mode)

    def _encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.module.encode_text(tokens)
