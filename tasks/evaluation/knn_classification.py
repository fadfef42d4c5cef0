"""kNN classification: each test image takes the majority label of its k most similar train images (cosine over
the cached normalised rows); the rule, its ties and weighting in tasks/score/knn.py. It reads the image entries
linear_probe reads, so after a probe (or zero-shot classification plus a probe) it encodes nothing. Each test image
is a sample row (unit ``image``: target, prediction, correct1), from which both metrics recompute.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, PositiveInt

from clipcache.tasks.contract import SampleUnit, TaskOptions
from clipcache.tasks.evaluation.base import Encoded, EncodeSettings, MetricInfo, Prepared, Scored, ScoreSettings
from clipcache.tasks.evaluation.common import sample_keys
from clipcache.tasks.evaluation.linear_probe import LinearProbe
from clipcache.tasks.evaluation.probes import ProbeTask

_TRAIN_SPLIT = LinearProbe.Options.model_fields["train_split"]  # one default and help, shared with linear_probe

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.datasets.base import EvalDataset


class KnnClassification(ProbeTask):
    name = "knn_classification"
    short = "kNN"
    description = "knn_acc1, knn_mean_per_class_recall: majority label of the k most similar cached train images"
    main_metrics = (("knn_acc1", None, "knn_acc1", 1),)
    metrics = (
        MetricInfo("knn_acc1", True, False, "knn_classification: fraction of test images whose k nearest train images "
                                            "(cosine) vote for their class"),
        MetricInfo("knn_mean_per_class_recall", True, False, "knn_classification: balanced accuracy of the kNN vote"),
    )
    samples = (SampleUnit("image", ("target", "prediction", "correct1"), "a test image: its class, the kNN vote, "
                                                                        "whether they agree"),)

    class Options(TaskOptions):
        """scikit-learn's KNeighborsClassifier settings, cosine metric."""

        encode_fields: ClassVar[tuple[str, ...]] = ("train_split",)

        train_split: str = Field(_TRAIN_SPLIT.default, description=_TRAIN_SPLIT.description)  # linear_probe's
        knn_k: PositiveInt = Field(20, description="neighbours per test image")
        knn_weights: Literal["uniform", "distance"] = Field(
            "uniform", description="uniform: one vote a neighbour; distance: 1 / (1 - cosine) (scikit-learn's)")

    def learn_splits(self, settings: EncodeSettings) -> dict[str, str]:
        return {"train": self.Options.of(settings).train_split}

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[EvalDataset],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.score.evidence import classification_evidence
        from clipcache.tasks.score.knn import knn_metrics, knn_predict
        from clipcache.tasks.score.stage import check_images

        started = time.perf_counter()
        options = self.Options.of(settings)
        test_entry, train_entry = (store.open(encoded.outcomes[role].ref.key) for role in ("image", "train"))
        check_images(test_entry, prepared.n_samples)
        positions = np.asarray(test_entry.array("position"), np.int64)
        target = np.asarray(test_entry.array("target"), np.int64)
        train_y = np.asarray(train_entry.array("target"), np.int64)
        prediction = knn_predict(train_entry.embeddings(), train_y, test_entry.embeddings(), k=options.knn_k,
                                 weights=options.knn_weights)
        samples = {"sample_index": positions, "target": target, "prediction": prediction,
                   "correct1": prediction == target}
        n_classes = int(max(train_y.max(), target.max())) + 1
        evidence = classification_evidence(samples, n_classes, resamples=settings.bootstrap, prefix="knn_",
                                           keys=sample_keys(prepared.data, positions))
        return Scored(knn_metrics(target, prediction), len(target), seconds=time.perf_counter() - started,
                      evidence=evidence)
