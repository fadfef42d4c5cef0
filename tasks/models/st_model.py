"""sentence-transformers text models (for text retrieval on BEIR folders)."""

from __future__ import annotations

import pickle

import numpy as np
import torch
from PIL import Image

from clipcache.storage.errors import ModelError
from clipcache.tasks.models.base import EmbeddingModel
from clipcache.tasks.models.custom_code import (
    HUB_CONFIG_FILES,
    check_hf_source,
    checkpoint_refusal,
    no_prompts,
    one_line,
)
from clipcache.tasks.models.loader import ResolvedModel


class SentenceTransformerModel(EmbeddingModel):
    """Text only: ``encode_texts`` returns L2-normalised float32 vectors (cosine similarity = dot product)."""

    def __init__(self, resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None):
        source = resolved.source
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own progress bars report the encoding
        try:
            with no_prompts():
                check_hf_source(source, cache_dir=cache_dir, files=(*HUB_CONFIG_FILES, "modules.json"))
                # trust_remote_code=False: modules.json may name only sentence-transformers' own classes, and the
                # transformers model inside is loaded without its repo's code (configs cannot turn it back on)
                module = SentenceTransformer(source, device=str(device), cache_folder=cache_dir,
                                             trust_remote_code=False)
        except ModelError:
            raise
        except pickle.UnpicklingError as e:  # a .bin/.pth weights file that torch's weights_only loader refused
            raise checkpoint_refusal(source, e) from e
        except Exception as e:  # sentence-transformers raises OSError/ValueError/HTTP errors for missing models
            raise ModelError(f"could not load sentence-transformers model {source!r}: {type(e).__name__}: "
                             f"{one_line(e)}") from e
        super().__init__(module, device, amp)

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            vectors = self.module.encode(texts, batch_size=len(texts), convert_to_numpy=True,
                                         normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    def image_transform(self, image: Image.Image) -> torch.Tensor:
        raise ModelError("a sentence-transformers model encodes text only; use it with --task text_retrieval")

    def encode_images(self, pixels: torch.Tensor) -> np.ndarray:
        raise ModelError("a sentence-transformers model encodes text only; use it with --task text_retrieval")
