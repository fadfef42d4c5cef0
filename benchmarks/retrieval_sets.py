"""The synthetic retrieval sets of benchmarks/sample_rows.py and retrieval_places_cuda.py (numpy and torch only)."""

from __future__ import annotations

import numpy as np
import torch


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def retrieval_set(rng: np.random.Generator, n_images: int, per_image: int, dim: int, ties: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Captions near their image (realistic ranks). ``ties``: as in COCO / Flickr, some captions are word for word
    the same text (a third of them copies of 250 frequent ones, each ~30 times) and some images the same picture
    (5% exact duplicates): exact score ties in both directions."""
    owner = np.repeat(np.arange(n_images), per_image)
    images = unit(rng, n_images, dim)
    if ties:
        copies = rng.random(n_images) < 0.05
        images[copies] = images[rng.integers(0, n_images, int(copies.sum()))]
    captions = images[owner] + 5.0 * unit(rng, len(owner), dim)
    captions /= np.linalg.norm(captions, axis=1, keepdims=True)
    if ties:
        frequent = captions[rng.choice(len(owner), 250, replace=False)].copy()
        repeated = rng.random(len(owner)) < 1 / 3
        captions[repeated] = frequent[rng.integers(0, len(frequent), int(repeated.sum()))]
    return torch.from_numpy(captions), torch.from_numpy(images), torch.from_numpy(owner)
