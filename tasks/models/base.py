"""The one interface the encode stage needs from any model."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from clipcache.tasks.models.devices import autocast

if TYPE_CHECKING:
    from clipcache.tasks.models.api_client import ApiUsage


class EmbeddingModel(ABC):
    """A loaded model that turns images and/or texts into L2-normalised float32 vectors."""

    # True when an input's vector does not depend on the other inputs of its batch (an API embedding each request on
    # its own): a resumed encode then asks only for the rows not yet committed, instead of redoing whole batches to
    # keep their composition (which makes local models' resumed vectors bit-identical).
    batch_invariant: bool = False

    def __init__(self, module: torch.nn.Module, device: torch.device, amp: bool):
        # Any: each family's module has its own encode methods (encode_image, get_image_features, encode, ...)
        self.module: Any = module.to(device).eval()
        self.device = device
        self.amp = amp

    @abstractmethod
    def image_transform(self, image: Image.Image) -> torch.Tensor:
        """PIL image -> (3, H, W) tensor; must be thread-safe (decoding threads call it)."""

    def portable_image_transform(self) -> Any | None:
        """``image_transform`` as a picklable object that decoding worker processes can run, or None when it needs
        this model object (then images are decoded in threads of the encoding process)."""
        return None

    @abstractmethod
    def encode_images(self, pixels: torch.Tensor) -> np.ndarray: ...

    @abstractmethod
    def encode_texts(self, texts: list[str]) -> np.ndarray: ...

    # The encode stage stores each row's L2 norm before normalisation beside the normalised row, so a task that
    # needs the raw features (MIEB probes them for SigLIP; its STS distances use them) gets normalised row x norm.
    # A model that cannot say (an API that returns normalised vectors) answers None: its entries keep no norms.
    def encode_images_with_norms(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        return self.encode_images(pixels), None

    def encode_texts_with_norms(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        return self.encode_texts(texts), None

    # The raw features themselves, for caches that keep them (the mteb encoder's pools: mteb's CLIP-style wrappers
    # hand its evaluators the model's output, and row x norm differs from it in the last bits): (normalised rows,
    # norms, raw float32 rows), the last two None where the model cannot give them.
    def encode_images_with_raw(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        return (*self.encode_images_with_norms(pixels), None)

    def encode_texts_with_raw(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        return (*self.encode_texts_with_norms(texts), None)

    # How many text batches a batch-invariant model takes in one call of ``encode_text_batches`` (an API model: one
    # request per batch, this many in flight); the encode stage hands it that many at once.
    text_batches_at_once: int = 1

    def encode_text_batches(self, batches: list[list[str]]) -> tuple[np.ndarray, np.ndarray | None]:
        """Several batches' vectors (and norms) in order: here one batch after another; an API model sends them as
        concurrent requests."""
        parts = [self.encode_texts_with_norms(batch) for batch in batches]
        norms = [n for _, n in parts]
        return (np.concatenate([v for v, _ in parts]),
                None if any(n is None for n in norms) else np.concatenate(norms))  # type: ignore[arg-type]

    def usage(self) -> ApiUsage | None:
        """What this model has spent so far (requests, tokens: an API model); None for a model that spends nothing."""
        return None

    def add_usage(self, usage: ApiUsage) -> None:  # noqa: B027 (a hook: only API models count)
        """Count in this model's cost line what copies of it spent elsewhere (sharded encoding's workers)."""

    def texts_as(self, kind: str) -> AbstractContextManager[None]:
        """Texts encoded inside are of ``kind`` (query, document, prompt, caption, ...): API models send queries and
        documents with their roles; local models embed every text the same way."""
        return nullcontext()

    def close(self, report: bool = True) -> None:  # noqa: B027 (a hook: most models hold nothing to release)
        """Called once when the run is over (``report``: it completed); API models print their cost line here."""


class TwoTowerModel(EmbeddingModel):
    """CLIP-style image and text towers: subclasses give preprocessing, tokenisation and the two forward passes."""

    @abstractmethod
    def tokenize(self, texts: list[str]) -> Any:
        """Texts -> whatever ``_encode_text`` takes (a tensor or a dict of tensors), on the CPU."""

    @abstractmethod
    def _encode_image(self, pixels: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def _encode_text(self, tokens: Any) -> torch.Tensor: ...

    def _to_device(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(self.device, non_blocking=True)
        return {k: v.to(self.device, non_blocking=True) for k, v in value.items()}

    def image_features_and_norms(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """L2-normalised float32 image vectors and each one's norm before normalisation (float32), left on the
        model's device: on CUDA nothing here waits for the device, so the encode stage can overlap copies and writes
        with the forward pass (tasks/encode/overlap.py)."""
        with torch.inference_mode(), autocast(self.device, self.amp):
            raw = self._encode_image(self._to_device(pixels))
            return _normalised_and_norms(raw)

    def image_features_norms_raw(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``image_features_and_norms`` and the raw float32 rows themselves, all left on the model's device."""
        with torch.inference_mode(), autocast(self.device, self.amp):
            raw = self._encode_image(self._to_device(pixels))
            features, norms = _normalised_and_norms(raw)
            return features, norms, raw.float()

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """L2-normalised float32 image vectors, left on the model's device."""
        return self.image_features_and_norms(pixels)[0]

    def encode_images(self, pixels: torch.Tensor) -> np.ndarray:
        return self.image_features(pixels).cpu().numpy()

    def encode_images_with_norms(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        features, norms = self.image_features_and_norms(pixels)
        return features.cpu().numpy(), norms.cpu().numpy()

    def encode_texts_with_norms(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        with torch.inference_mode(), autocast(self.device, self.amp):
            features, norms = _normalised_and_norms(self._encode_text(self._to_device(self.tokenize(texts))))
        return features.cpu().numpy(), norms.cpu().numpy()

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        return self.encode_texts_with_norms(texts)[0]

    def encode_images_with_raw(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        features, norms, raw = self.image_features_norms_raw(pixels)
        return features.cpu().numpy(), norms.cpu().numpy(), raw.cpu().numpy()

    def encode_texts_with_raw(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        with torch.inference_mode(), autocast(self.device, self.amp):
            raw = self._encode_text(self._to_device(self.tokenize(texts)))
            features, norms = _normalised_and_norms(raw)
        return features.cpu().numpy(), norms.cpu().numpy(), raw.float().cpu().numpy()


def _normalised_and_norms(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The normalised rows are clip_benchmark's operations exactly (F.normalize under autocast, then float32), so
    # their bits do not change with the norms beside them; the norm is taken in float32 of the raw features.
    features = F.normalize(raw, dim=-1).float()
    return features, torch.linalg.vector_norm(raw.float(), dim=-1)


def pooled(output: Any) -> torch.Tensor:
    """transformers 5 returns model outputs from ``get_*_features``; earlier versions returned the tensor."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output
