"""Zero-shot classification metrics, computed as LAION clip_benchmark computes them, in torch.

The operations mirror clip_benchmark's so that float32 rounding, and therefore any exact tie, comes out the same:

- classifier: per class, the mean of its (L2-normalised) template embeddings, divided by its norm;
- logits per data-loader batch on the device: ``(100 * image_features) @ classifier`` (Python evaluates
  ``100. * features @ classifier`` left to right);
- ``acc1`` / ``acc5``: ``torch.topk(logits, max(ks))`` once per row on the CPU, ``acc_k`` = the true class among
  the first k kept (``acc5`` is NaN below 5 classes); ties among logits are resolved as topk resolves them;
- ``mean_per_class_recall``: balanced accuracy of ``argmax`` (the first maximum), over the classes present;
- multilabel ``mean_average_precision``: per class, ``torch.sort`` descending, mean precision at the positives
  (0 for a class without positives), as torchnet's APMeter which clip_benchmark uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import torch

LOGIT_SCALE = 100.0


def _tensor(values: np.ndarray | torch.Tensor) -> torch.Tensor:
    return values if isinstance(values, torch.Tensor) else torch.from_numpy(np.asarray(values))


def zero_shot_classifier(prompt_embeddings: np.ndarray | torch.Tensor, n_classes: int, n_templates: int,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """(dim, n_classes) classifier from class-major prompt embeddings (row = class * n_templates + template)."""
    embeddings = _tensor(prompt_embeddings).to(device=device, dtype=torch.float32)
    per_class = embeddings.reshape(n_classes, n_templates, -1)
    columns = []
    for c in range(n_classes):  # one class at a time, as clip_benchmark builds it
        mean = per_class[c].mean(dim=0)
        columns.append(mean / mean.norm())
    return torch.stack(columns, dim=1)


def logit_batches(images: torch.Tensor, classifier: torch.Tensor, batch_size: int) -> Iterable[torch.Tensor]:
    """Logits on the CPU, computed on the classifier's device in the blocks clip_benchmark's data loader makes."""
    with torch.inference_mode():
        for lo in range(0, len(images), batch_size):
            features = images[lo : lo + batch_size].to(classifier.device)
            yield (LOGIT_SCALE * features @ classifier).float().cpu()


def logits(images: np.ndarray | torch.Tensor, classifier: np.ndarray | torch.Tensor,
           batch_size: int = 1 << 30) -> torch.Tensor:
    return torch.cat(list(logit_batches(_tensor(images).float(), _tensor(classifier).float(), batch_size)))


GROUP_ROWS = 2048  # rows of logits whose per-sample outcomes are computed together


class TopK(NamedTuple):
    values: torch.Tensor
    indices: torch.Tensor


class ClassificationCounts:
    """Metrics accumulated batch by batch (no dense samples x classes matrix is kept, except for multilabel).
    With ``keep_samples``, each sample's outcome is kept too (:meth:`samples`): what the metrics are made of."""

    def __init__(self, n_classes: int, keep_samples: bool = False):
        self.ks = (1, 5) if n_classes >= 5 else (1,)
        self.hits = dict.fromkeys(self.ks, 0)
        self.predictions: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []
        self.keep_samples = keep_samples
        self._samples: list[dict[str, torch.Tensor]] = []
        # batches whose outcomes are not computed yet: done a group at a time (fewer, larger tensor operations;
        # every outcome is row-wise, so grouping batches changes no value)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[int, torch.Tensor],
                                  torch.Tensor]] = []
        self._pending_rows = 0

    def add(self, batch_logits: torch.Tensor, targets: torch.Tensor) -> None:
        top = torch.topk(batch_logits, min(max(self.ks), batch_logits.shape[1]), dim=1)
        kept = top.indices
        correct = {k: (kept[:, :k] == targets[:, None]).any(dim=1) for k in self.ks}
        for k in self.ks:
            self.hits[k] += int(correct[k].sum())
        predictions = batch_logits.argmax(dim=1)
        self.predictions.append(predictions)
        self.targets.append(targets)
        if self.keep_samples:
            self._pending.append((batch_logits, targets, top.values, top.indices, correct, predictions))
            self._pending_rows += len(targets)
            if self._pending_rows >= GROUP_ROWS:
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        logits, targets, values, indices, correct, predictions = zip(*self._pending, strict=True)
        top = TopK(torch.cat(values), torch.cat(indices))
        both = {k: torch.cat([c[k] for c in correct]) for k in correct[0]}
        self._samples.append(sample_outcomes(torch.cat(logits), torch.cat(targets), top, both,
                                             torch.cat(predictions)))
        self._pending, self._pending_rows = [], 0

    def samples(self) -> dict[str, np.ndarray]:
        """Per sample: target, prediction (argmax), top (topk's kept classes, best first), correct1 / correct5
        (topk's choice, as acc1 / acc5 count them), score (the target's logit), rank (1 + classes scored above the
        target), tied (another class scores exactly the target's logit) and margin (target minus best other)."""
        self._flush()
        return outcome_arrays(self._samples)

    def metrics(self) -> dict[str, float]:
        n = sum(len(t) for t in self.targets)
        if n == 0:
            return {"acc1": math.nan, "acc5": math.nan, "mean_per_class_recall": math.nan}
        return {"acc1": self.hits[1] / n, "acc5": self.hits[5] / n if 5 in self.hits else math.nan,
                "mean_per_class_recall": balanced_recall(torch.cat(self.predictions), torch.cat(self.targets))}


def sample_outcomes(batch_logits: torch.Tensor, targets: torch.Tensor, top: torch.return_types.topk | TopK,
                    correct: dict[int, torch.Tensor], predictions: torch.Tensor) -> dict[str, torch.Tensor]:
    """One batch's per-sample outcomes, as tensors (converted once, in :meth:`ClassificationCounts.samples`)."""
    score = batch_logits.gather(1, targets[:, None])
    values, kept = top.values, top.indices
    if kept.shape[1] < 2 <= batch_logits.shape[1]:  # acc1 only (under 5 classes): the second best, for the margin
        second = torch.topk(batch_logits, 2, dim=1)  # a separate call: the kept class stays topk(1)'s choice
        values, kept = second.values, second.indices
    if kept.shape[1] > 1:  # the best other class: topk's first, unless that is the target, then its second
        best_other = torch.where(kept[:, 0] == targets, values[:, 1], values[:, 0])
    else:
        best_other = torch.full_like(values[:, 0], torch.nan)
    five = {"correct5": correct[5]} if 5 in correct else {}  # acc5 is NaN below 5 classes
    if batch_logits.device.type == "cpu":  # NumPy's counts are single passes without a bool temporary: faster here
        logits, own = batch_logits.numpy(), score.numpy()
        higher = torch.from_numpy(np.count_nonzero(logits > own, axis=1))
        tied = torch.from_numpy(np.count_nonzero(logits == own, axis=1) > 1)
    else:
        higher, tied = (batch_logits > score).sum(dim=1), (batch_logits == score).sum(dim=1) > 1
    return {"target": targets, "prediction": predictions, "top": top.indices.to(torch.int32), "correct1": correct[1],
            **five, "score": score[:, 0], "rank": 1 + higher, "tied": tied, "margin": score[:, 0] - best_other}


def outcome_arrays(batches: list[dict[str, torch.Tensor]]) -> dict[str, np.ndarray]:
    """Batches of :func:`sample_outcomes` as one NumPy array per column, in the sample rows' types."""
    if not batches:
        return {}
    out = {name: torch.cat([s[name] for s in batches]).numpy() for name in batches[0]}
    for name in ("score", "margin"):
        out[name] = out[name].astype(np.float64)
    out["target"], out["prediction"] = out["target"].astype(np.int64), out["prediction"].astype(np.int64)
    return out


def balanced_recall(predictions: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean over the classes present in ``targets`` of per-class recall (sklearn's balanced_accuracy_score)."""
    recalls = [float((predictions[targets == c] == c).double().mean()) for c in torch.unique(targets)]
    return float(np.mean(recalls))


def accuracy_at_k(logits: np.ndarray | torch.Tensor, targets: np.ndarray | torch.Tensor, k: int) -> float:
    """Fraction of samples whose true class is among the ``k`` logits topk keeps (all of them when k >= classes)."""
    scores, truth = _tensor(logits).float(), _tensor(targets).long()
    if len(truth) == 0:
        return math.nan
    kept = torch.topk(scores, min(k, scores.shape[1]), dim=1).indices
    return float((kept == truth[:, None]).any(dim=1).sum()) / len(truth)


def mean_per_class_recall(logits: np.ndarray | torch.Tensor, targets: np.ndarray | torch.Tensor) -> float:
    truth = _tensor(targets).long()
    return math.nan if len(truth) == 0 else balanced_recall(_tensor(logits).float().argmax(dim=1), truth)


def average_precision_per_class(logits: np.ndarray | torch.Tensor, multi_hot: np.ndarray | torch.Tensor
                                ) -> torch.Tensor:
    """AP per class: mean of precision@rank over the ranks of the positives (0 for a class with no positive)."""
    scores, truth = _tensor(logits).float(), _tensor(multi_hot)
    ranks = torch.arange(1, scores.shape[0] + 1, dtype=torch.float32)
    ap = torch.zeros(scores.shape[1])
    for c in range(scores.shape[1]):
        order = torch.sort(scores[:, c], 0, True).indices
        hits = truth[order, c]
        precision = hits.float().cumsum(0) / ranks
        ap[c] = precision[hits.bool()].sum() / max(float(hits.sum()), 1.0)
    return ap


def mean_average_precision(logits: np.ndarray | torch.Tensor, multi_hot: np.ndarray | torch.Tensor) -> float:
    return float(average_precision_per_class(logits, multi_hot).mean())


def classification_metrics(logits: np.ndarray | torch.Tensor, targets: np.ndarray | torch.Tensor,
                           n_classes: int) -> dict[str, float]:
    """acc1, acc5 (NaN below 5 classes, as clip_benchmark) and mean_per_class_recall; mAP for multi-hot targets."""
    scores, truth = _tensor(logits).float(), _tensor(targets)
    if truth.ndim == 2:
        return {"mean_average_precision": mean_average_precision(scores, truth)}
    counts = ClassificationCounts(n_classes)
    counts.add(scores, truth.long())
    return counts.metrics()
