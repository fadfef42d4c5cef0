"""Linear probe over cached image features, as LAION clip_benchmark 1.6.2 defines it (``metrics/linear_probe.py``).

- a logistic-regression layer (``torch.nn.Linear`` then cross-entropy), trained with AdamW for ``epochs`` epochs over
  shuffled batches, its learning rate on a cosine schedule without warm-up, one step per batch; ``torch.manual_seed
  (seed)`` before the layer is made, so its initial weights and the batch order follow from the seed;
- few-shot: ``fewshot_k`` training samples per class, picked in the order of ``torch.randperm`` of the training
  features drawn right after ``torch.manual_seed(seed)``; ``-1`` takes them all;
- weight decay: with validation features (a val split, or ``val_proportion`` of train), clip_benchmark's sweep over
  ``logspace(-6, 2, 97)``: 7 evenly spaced values first, then a bisection around the best by validation acc1 (spans
  8, 4, 2, 1; the first best wins ties); the final layer is trained on train + val when ``fewshot_k == -1``, else on
  the few-shot set; without validation features the weight decay is 0;
- metrics on the test features: ``lp_acc1``, ``lp_acc5`` (only with more than five classes in the targets, as
  clip_benchmark checks ``target.max() >= 5``) and ``lp_mean_per_class_recall`` (balanced accuracy of the argmax);
  each test sample's outcome (:func:`probe`) is what they are the means of.

Where clip_benchmark relies on its global random state, this code seeds it: clip_benchmark's few-shot permutation and
its ``val_proportion`` split use the RNG state left by loading the model and reading the data, so the same seed gives
other picks for other model loaders there; here they depend on ``seed`` alone. Given the same picks, the computation
is clip_benchmark's, operation for operation (tests/test_linear_probe.py runs its code on the same features).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from clipcache.storage.errors import DatasetError
from clipcache.tasks.score.classification import balanced_recall, outcome_arrays, sample_outcomes

WEIGHT_DECAYS = np.logspace(-6, 2, num=97).tolist()
FIRST_WEIGHT_DECAYS = np.logspace(-6, 2, num=7).tolist()


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """What one probe is trained with; every value is given (the defaults are linear_probe's Options)."""

    lr: float
    epochs: int
    batch_size: int
    fewshot_k: int
    seed: int
    device: str = "cpu"


def held_out_split(n: int, proportion: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held-out) indices as ``torch.utils.data.random_split(range(n), [1 - proportion, proportion])`` makes
    them (floored lengths, the remainder given round-robin), with a generator seeded by ``seed``."""
    lengths = [math.floor(n * f) for f in (1 - proportion, proportion)]
    for i in range(n - sum(lengths)):
        lengths[i % 2] += 1
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[: lengths[0]], perm[lengths[0] :]


def fewshot_indices(targets: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """Indices of the training samples a probe uses: ``k`` per class in ``randperm`` order, or all (``k < 0``)."""
    torch.manual_seed(seed)
    perm = torch.randperm(len(targets)).tolist()
    if k < 0:
        return torch.tensor(perm, dtype=torch.long)
    counts: dict[int, int] = {}
    chosen = []
    for p in perm:
        label = int(targets[p])
        counts.setdefault(label, 0)
        if counts[label] < k:
            counts[label] += 1
            chosen.append(p)
    short = {c: n for c, n in counts.items() if n < k}
    if short:
        c, n = min(short.items(), key=lambda item: item[1])
        raise DatasetError(f"fewshot_k: {k} samples per class asked, but class {c} has only {n} in the training split "
                           f"(lower --fewshot_k, or -1 for all)")
    return torch.tensor(chosen, dtype=torch.long)


def train(features: torch.Tensor, targets: torch.Tensor, n_classes: int, weight_decay: float,
          settings: ProbeSettings) -> torch.nn.Linear:
    torch.manual_seed(settings.seed)
    layer = torch.nn.Linear(features.shape[1], n_classes).to(settings.device)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=settings.lr, weight_decay=weight_decay)
    criterion = torch.nn.CrossEntropyLoss()
    loader = DataLoader(TensorDataset(features, targets), batch_size=settings.batch_size, shuffle=True)
    steps = settings.epochs * len(loader)
    for epoch in range(settings.epochs):
        for i, (x, y) in enumerate(loader):
            step = i + epoch * len(loader)
            for group in optimizer.param_groups:  # cosine schedule, no warm-up (clip_benchmark's cosine_lr)
                group["lr"] = 0.5 * (1 + np.cos(np.pi * step / steps)) * settings.lr
            optimizer.zero_grad()
            loss = criterion(layer(x.to(settings.device)), y.to(settings.device))
            loss.backward()
            optimizer.step()
    return layer


def logits(layer: torch.nn.Linear, features: torch.Tensor, device: str, batch_size: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([layer(features[lo : lo + batch_size].to(device)).cpu()
                          for lo in range(0, len(features), batch_size)])


def accuracies(scores: torch.Tensor, targets: torch.Tensor, ks: tuple[int, ...]) -> list[float]:
    """Top-k accuracy for each k from one ``topk(max(ks))`` call (clip_benchmark's ``accuracy``)."""
    kept = scores.float().topk(max(ks), dim=1).indices
    hits = kept == targets[:, None]
    return [float(hits[:, :k].any(dim=1).float().sum()) / len(targets) for k in ks]


def best_weight_decay(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                      n_classes: int, settings: ProbeSettings) -> float:
    """clip_benchmark's sweep: 7 values over the grid, then spans 8, 4, 2, 1 around the best (validation acc1)."""
    def peak(candidates: list[int]) -> int:
        best, best_acc = 0, 0.0
        for idx in candidates:
            layer = train(train_x, train_y, n_classes, WEIGHT_DECAYS[idx], settings)
            [acc] = accuracies(logits(layer, val_x, settings.device, settings.batch_size), val_y, (1,))
            if best_acc < acc:
                best, best_acc = idx, acc
        return best

    index = peak([i for i, wd in enumerate(WEIGHT_DECAYS) if wd in FIRST_WEIGHT_DECAYS])
    span = 8
    while span > 0:
        index = peak([max(index - span, 0), index, min(index + span, len(WEIGHT_DECAYS) - 1)])
        span //= 2
    return WEIGHT_DECAYS[index]


@dataclass(frozen=True)
class ProbeResult:
    metrics: dict[str, float]
    weight_decay: float  # the one chosen (0 without validation features)
    # per test sample, as zero-shot classification keeps them (ClassificationCounts.samples): target, prediction
    # (argmax), top (topk's classes), correct1 / correct5 (what lp_acc1 / lp_acc5 count), score, rank, tied, margin
    samples: dict[str, np.ndarray]


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                 settings: ProbeSettings, *, val_x: torch.Tensor | None = None,
                 val_y: torch.Tensor | None = None) -> tuple[dict[str, float], float]:
    """(metrics, chosen weight decay). Features are float32 rows; targets int64 class ids."""
    result = probe(train_x, train_y, test_x, test_y, settings, val_x=val_x, val_y=val_y)
    return result.metrics, result.weight_decay


def probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
          settings: ProbeSettings, *, val_x: torch.Tensor | None = None,
          val_y: torch.Tensor | None = None) -> ProbeResult:
    """:func:`linear_probe`, with each test sample's outcome."""
    picked = fewshot_indices(train_y, settings.fewshot_k, settings.seed)
    fit_x, fit_y = train_x[picked], train_y[picked]
    n_classes = int(train_y.max()) + 1
    weight_decay = 0.0
    if val_x is not None and val_y is not None:
        weight_decay = best_weight_decay(fit_x, fit_y, val_x, val_y, n_classes, settings)
        if settings.fewshot_k < 0:  # the full probe learns from train + val once the weight decay is chosen
            fit_x, fit_y = torch.cat([fit_x, val_x]), torch.cat([fit_y, val_y])
    layer = train(fit_x, fit_y, n_classes, weight_decay, settings)
    scores = logits(layer, test_x, settings.device, settings.batch_size).float()
    ks = (1, 5) if int(test_y.max()) >= 5 else (1,)
    top = scores.topk(max(ks), dim=1)  # one call for every k, as accuracies() (clip_benchmark's accuracy)
    correct = {k: (top.indices[:, :k] == test_y[:, None]).any(dim=1) for k in ks}
    predictions = scores.argmax(dim=1)
    acc = {k: float(correct[k].float().sum()) / len(test_y) for k in ks}
    metrics = {"lp_acc1": acc[1], "lp_acc5": acc.get(5, math.nan),
               "lp_mean_per_class_recall": balanced_recall(predictions, test_y)}
    # a test class the training split lacks has no logit: it scores -inf (ranked last) in the sample rows
    missing = int(test_y.max()) + 1 - scores.shape[1]
    padded = torch.cat([scores, torch.full((len(scores), missing), -torch.inf)], dim=1) if missing > 0 else scores
    samples = outcome_arrays([sample_outcomes(padded, test_y, top, correct, predictions)])
    return ProbeResult(metrics, weight_decay, samples)
