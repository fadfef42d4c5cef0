"""Image-caption selection accuracy (clip_benchmark's ``image_caption_selection``; SugarCrepe, Winoground).

Each item has images ``I_0..I_{m-1}`` and captions ``T_0..T_{n-1}``; image ``j`` belongs with caption ``j`` for
``j < min(m, n)``. With ``S = I @ T^T`` (cosine similarities of the item's normalised embeddings):

- ``text_acc``: every image's best caption is its own, ``argmax_c S[j, c] == j`` for all j (Winoground's text score);
- ``image_acc``: every caption's best image is its own, ``argmax_i S[i, j] == j`` for all j (its image score);
- ``acc``: both at once (Winoground's group score).

``argmax`` keeps the first of equal maxima, as torch does in clip_benchmark; each item's product is computed on its
own in fp32, like clip_benchmark's loop, so the numbers are its numbers bit for bit given the same embeddings.
Each metric is the fraction of items, averaged in float32 as clip_benchmark averages.
"""

from __future__ import annotations

import torch


def selection_accuracy(images: torch.Tensor, texts: torch.Tensor) -> tuple[dict[str, float], int]:
    """``images`` (items, m, d) and ``texts`` (items, n, d): the three accuracies, and how many items have a tied
    maximum that decides one of them (the first index wins there)."""
    n_items, m, _ = images.shape
    gt = torch.arange(min(m, texts.shape[1]))
    image_ok, text_ok, both = [], [], []
    tied = 0
    for i in range(n_items):
        scores = images[i] @ texts[i].t()
        text_right = bool((scores.argmax(dim=1)[: len(gt)] == gt).all())
        image_right = bool((scores.argmax(dim=0)[: len(gt)] == gt).all())
        image_ok.append(image_right)
        text_ok.append(text_right)
        both.append(text_right and image_right)
        rows, cols = scores[: len(gt)], scores[:, : len(gt)]
        tied += bool(((rows == rows.max(dim=1, keepdim=True).values).sum(dim=1) > 1).any()
                     or ((cols == cols.max(dim=0, keepdim=True).values).sum(dim=0) > 1).any())

    def mean(flags: list[bool]) -> float:
        return torch.tensor(flags, dtype=torch.float32).mean().item()

    return {"image_acc": mean(image_ok), "text_acc": mean(text_ok), "acc": mean(both)}, tied
