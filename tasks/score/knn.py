"""k-nearest-neighbour classification over cached image features (mteb 2.x has no kNN protocol for images, so this
is the standard one, equal to scikit-learn's ``KNeighborsClassifier(n_neighbors=k, metric="cosine",
weights=...)`` fitted on the train features):

- neighbours: the ``k`` train rows of highest cosine similarity to a test row (the cached rows are L2-normalised, so
  cosine is their dot product, taken in float64); among exactly equal similarities the lower train row comes first;
- votes: ``uniform`` gives each neighbour one vote; ``distance`` gives it ``1 / (1 - cosine)`` (scikit-learn's
  inverse cosine distance), and a test row with neighbours at distance 0 lets only those vote;
- prediction: the label with the most votes, the smallest label among equal vote totals (scikit-learn's ``mode``
  and ``weighted_mode``);
- ``knn_acc1``: fraction of test rows whose prediction is their label; ``knn_mean_per_class_recall``: the balanced
  accuracy of the predictions (mean over the labels present in the test targets of per-label recall).

Test rows go in blocks, so memory is a block of similarities, never test x train.
"""

from __future__ import annotations

import numpy as np

from clipcache.storage.errors import DatasetError

BLOCK_ROWS = 1024


def knn_predict(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, *, k: int,
                weights: str) -> np.ndarray:
    """The predicted label of every test row."""
    if k > len(train_y):
        raise DatasetError(f"knn_k: {k} neighbours asked, but the train split has {len(train_y)} images")
    classes, codes = np.unique(train_y, return_inverse=True)
    train = np.asarray(train_x, np.float64)
    out = np.empty(len(test_x), dtype=train_y.dtype)
    for lo in range(0, len(test_x), BLOCK_ROWS):
        sims = np.asarray(test_x[lo:lo + BLOCK_ROWS], np.float64) @ train.T
        neighbours = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        if weights == "uniform":
            vote = np.ones(neighbours.shape)
        else:
            distance = np.maximum(1 - np.take_along_axis(sims, neighbours, axis=1), 0)
            exact = distance == 0
            with np.errstate(divide="ignore"):
                vote = np.where(exact.any(axis=1, keepdims=True), exact.astype(np.float64), 1 / distance)
        totals = np.zeros((len(neighbours), len(classes)))
        np.add.at(totals, (np.arange(len(neighbours))[:, None], codes[neighbours]), vote)
        out[lo:lo + len(neighbours)] = classes[totals.argmax(axis=1)]
    return out


def knn_metrics(target: np.ndarray, prediction: np.ndarray) -> dict[str, float]:
    right = prediction == target
    present = np.unique(target)
    recall = [float(right[target == c].mean()) for c in present]
    return {"knn_acc1": float(right.mean()), "knn_mean_per_class_recall": float(np.mean(recall))}
