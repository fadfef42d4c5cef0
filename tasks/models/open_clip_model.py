"""An open_clip model in memory (imports torch and open_clip; loaded only when something must be encoded)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from clipcache.storage.errors import ModelError
from clipcache.tasks.models.base import TwoTowerModel
from clipcache.tasks.models.custom_code import (
    check_folder,
    check_hf_source,
    checkpoint_refusal,
    custom_code_refusal,
    no_prompts,
    one_line,
)
from clipcache.tasks.models.loader import RANDOM_INIT_SEED, ResolvedModel


def _model_config(name: str, cache_dir: str | None) -> tuple[dict[str, Any], str]:
    """The model_cfg open_clip will build ``name`` from, and where it comes from."""
    import open_clip
    from open_clip.pretrained import download_pretrained_from_hf

    if name.startswith("hf-hub:"):
        path = download_pretrained_from_hf(name[len("hf-hub:"):], filename="open_clip_config.json",
                                           cache_dir=cache_dir)
        config = json.loads(Path(path).read_text(encoding="utf-8"))
        return config.get("model_cfg", config), f"{name}/open_clip_config.json"
    where = f"{name[len('local-dir:'):]}/open_clip_config.json" if name.startswith("local-dir:") else name
    return open_clip.get_model_config(name) or {}, where


def check_custom_code(name: str, cache_dir: str | None) -> None:
    """open_clip builds an HF text tower and tokenizer from what the model config names, with the config's own
    ``tokenizer_kwargs`` and without ``trust_remote_code``: refuse a config or a named model that asks for code."""
    if name.startswith("local-dir:"):
        check_folder(Path(name[len("local-dir:"):]))  # HFTokenizer reads a local-dir model's own folder
    model_cfg, where = _model_config(name, cache_dir)
    text_cfg = model_cfg.get("text_cfg") or {}
    if (text_cfg.get("tokenizer_kwargs") or {}).get("trust_remote_code"):
        raise custom_code_refusal(where, "text_cfg.tokenizer_kwargs sets trust_remote_code")
    if text_cfg.get("hf_model_name"):
        check_hf_source(str(text_cfg["hf_model_name"]))  # HFTextEncoder: AutoConfig/AutoModel, default HF cache
    if text_cfg.get("hf_tokenizer_name") and not name.startswith("local-dir:"):
        check_hf_source(str(text_cfg["hf_tokenizer_name"]), cache_dir=cache_dir)


class OpenClipModel(TwoTowerModel):
    def __init__(self, resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None):
        import open_clip

        name, pretrained = resolved.source, resolved.pretrained
        if resolved.arch_config:
            open_clip.add_model_config(resolved.arch_config)
        if pretrained is None and not name.startswith(("local-dir:", "hf-hub:")):
            torch.manual_seed(RANDOM_INIT_SEED)  # random weights must be reproducible: they are part of the key
        try:
            with no_prompts():
                check_custom_code(name, cache_dir)
                # weights_only=True (open_clip's default, stated): a .pt/.bin checkpoint is unpickled by torch's
                # restricted loader, so a pickle in it cannot run code; .safetensors files hold no code at all
                module, _, transform = open_clip.create_model_and_transforms(
                    name, pretrained=pretrained, cache_dir=cache_dir, device="cpu", weights_only=True)
                self.tokenizer = open_clip.get_tokenizer(name, cache_dir=cache_dir)
        except ModelError:
            raise
        except pickle.UnpicklingError as e:  # a .pt/.bin/.pth checkpoint that torch's weights_only loader refused
            raise checkpoint_refusal(pretrained or name.removeprefix("local-dir:"), e) from e
        except Exception as e:  # open_clip raises RuntimeError/ValueError/OSError/HTTP errors for the same problem
            raise ModelError(f"could not load open_clip model {name!r} (pretrained={pretrained!r}): "
                             f"{type(e).__name__}: {one_line(e)}") from e
        self.transform = transform
        super().__init__(module, device, amp)

    def image_transform(self, image: Image.Image) -> torch.Tensor:
        return self.transform(image)

    def portable_image_transform(self) -> Any:
        return self.transform

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return self.tokenizer(texts)

    def _encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.module.encode_image(pixels)

    def _encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.module.encode_text(tokens)
