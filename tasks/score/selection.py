"""Image-caption selection accuracy (clip_benchmark's ``image_caption_selection``; SugarCrepe, Winoground).

Each item has images ``I_0..I_{m-1}`` and captions ``T_0..T_{n-1}``; image ``j`` belongs with caption ``j`` for
``j < min(m, n)``. With ``S = I @ T^T`` (cosine similarities of the item's normalised embeddings):

- ``text_acc``: every image's best caption is its own, ``argmax_c S[j, c] == j`` for all j (Winoground's text score);
- ``image_acc``: every caption's best image is its own, ``argmax_i S[i, j] == j`` for all j (its image score);
- ``acc``: both at once (Winoground's group score);
- ``macro_acc`` (datasets with groups, ARO's VG-Relation and VG-Attribution): the mean over groups of ``text_acc``
  within the group (:func:`grouped_accuracy`).

``argmax`` keeps the first of equal maxima, as torch does in clip_benchmark; each item's product is computed on its
own in fp32, like clip_benchmark's loop, so the numbers are its numbers bit for bit given the same embeddings.
Each metric is the fraction of items, averaged in float32 as clip_benchmark averages.
"""

from __future__ import annotations

import numpy as np
import torch


def selection_outcomes(images: torch.Tensor, texts: torch.Tensor, *,
                       targets: tuple[int, ...] | None = None, strict: bool = False) -> dict[str, np.ndarray]:
    """Per item of ``images`` (items, m, d) and ``texts`` (items, n, d): ``text_right`` / ``image_right`` (its text
    and image scores), ``text_tied`` / ``image_tied`` (a tied maximum decided that score: the first index won), and
    ``text_margin`` / ``image_margin``: the smallest gap, over the item's pairs, between a pair's similarity and the
    best rival of its image (text side) or caption (image side); NaN where there is no rival (one image).

    ``targets`` names the caption of each image (image j's is caption ``targets[j]``; default j). ARO and VALSE list
    the right caption after the wrong one, so a tie, where the first index wins, counts as a miss, as it does in
    their own ``argmax`` / strict comparison.

    ``strict``: a pair is right only when its similarity is strictly above every rival's, so a tie is a miss on
    either side whatever the order (COLA's ``im0_c0 > im1_c0 and im1_c1 > im0_c1``, VL-CheckList's ``pos > neg``);
    each pair's dot product is then summed on its own, as those references score each pair, so equal embeddings
    tie exactly (a matrix product's kernel may sum two equal columns in different orders)."""
    n_items, m, _ = images.shape
    g = min(m, texts.shape[1]) if targets is None else len(targets)
    gt = torch.arange(g)
    want = gt if targets is None else torch.tensor(targets, dtype=torch.int64)
    out = {name: np.zeros(n_items, dtype=bool) for name in ("text_right", "image_right", "text_tied", "image_tied")}
    out |= {name: np.full(n_items, np.nan) for name in ("text_margin", "image_margin")}
    for i in range(n_items):
        scores = (images[i][:, None] * texts[i][None]).sum(dim=-1) if strict else images[i] @ texts[i].t()
        rows, cols = scores[:g], scores[:, want]
        if strict:  # own similarity above the best rival (-inf where there is none)
            right, rival_rows, rival_cols = scores[gt, want], rows.clone(), cols.clone()
            rival_rows[gt, want], rival_cols[gt, gt] = -torch.inf, -torch.inf
            out["text_right"][i] = bool((right > rival_rows.max(dim=1).values).all())
            out["image_right"][i] = bool((right > rival_cols.max(dim=0).values).all())
        else:
            out["text_right"][i] = bool((scores.argmax(dim=1)[:g] == want).all())
            out["image_right"][i] = bool((cols.argmax(dim=0) == gt).all())
        out["text_tied"][i] = bool(((rows == rows.max(dim=1, keepdim=True).values).sum(dim=1) > 1).any())
        out["image_tied"][i] = bool(((cols == cols.max(dim=0, keepdim=True).values).sum(dim=0) > 1).any())
        right = scores[gt, want]
        for side, rivals, own in (("text", rows.clone(), want), ("image", cols.t().clone(), gt)):
            if rivals.shape[1] > 1:  # rivals[j]: the other captions of image j / the other images of caption j
                rivals[gt, own] = -torch.inf
                out[f"{side}_margin"][i] = float((right - rivals.max(dim=1).values).min())
    return out


def grouped_accuracy(right: np.ndarray, groups: list[str] | np.ndarray, *, exclude: frozenset[str] = frozenset(),
                     min_count: int = 1) -> float:
    """ARO's macro accuracy: the mean over groups (sorted, as ``np.unique`` lists them) of each group's accuracy,
    in float64 as its numpy/pandas code averages, over groups with at least ``min_count`` items and not in
    ``exclude`` (VG-Relation leaves out its symmetric relations, VG-Attribution pairs with fewer than 25 items).
    NaN when no group qualifies."""
    labels = np.asarray(groups)
    right = np.asarray(right, dtype=bool)
    accs = [right[labels == g].mean() for g in np.unique(labels)
            if g not in exclude and int((labels == g).sum()) >= min_count]
    return float(np.mean(accs)) if accs else float("nan")


def selection_accuracy(images: torch.Tensor, texts: torch.Tensor) -> tuple[dict[str, float], int]:
    """``images`` (items, m, d) and ``texts`` (items, n, d): the three accuracies, and how many items have a tied
    maximum that decides one of them (the first index wins there)."""
    return selection_metrics(selection_outcomes(images, texts))


def selection_metrics(outcomes: dict[str, np.ndarray]) -> tuple[dict[str, float], int]:
    """The three accuracies from the items' outcomes (each a float32 mean, as clip_benchmark averages), and the
    tie-sensitive items."""
    def mean(flags: np.ndarray) -> float:
        return torch.tensor(flags.tolist(), dtype=torch.float32).mean().item()

    group = outcomes["text_right"] & outcomes["image_right"]
    tied = int((outcomes["text_tied"] | outcomes["image_tied"]).sum())
    return {"image_acc": mean(outcomes["image_right"]), "text_acc": mean(outcomes["text_right"]),
            "acc": mean(group)}, tied
