"""Image clustering (MIEB's clustering task family): k-means over the cached image embeddings of a classification
dataset, with as many clusters as the dataset has classes present, scored against the labels.

- ``image_clustering_nmi``: normalised mutual information between clusters and classes (arithmetic mean
  normalisation, scikit-learn's ``normalized_mutual_info_score``, what MIEB's image clustering evaluator reports);
- ``image_clustering_ari``: adjusted Rand index (``adjusted_rand_score``).

Each image's class and cluster are kept as its sample row, from which both are recomputed exactly; the metrics have
no interval (why: ``clipcache.tasks.score.evidence.clustering_evidence``).

k-means is scikit-learn's ``KMeans`` (k-means++ initialisation, ``n_init=10``, ``random_state=seed``), on the
L2-normalised embeddings: the same cache entry zero-shot classification reads, so clustering after a zero-shot run
encodes nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from clipcache.storage.errors import DatasetError
from clipcache.tasks.contract import SampleUnit, SeededOptions
from clipcache.tasks.evaluation.base import Encoded, MetricInfo, Prepared, Scored, ScoreSettings
from clipcache.tasks.evaluation.common import sample_keys
from clipcache.tasks.evaluation.probes import ProbeTask

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.datasets.base import EvalDataset


class ImageClustering(ProbeTask):
    name = "image_clustering"
    short = "clustering"
    description = "image_clustering_nmi, image_clustering_ari of k-means over cached image embeddings"
    main_metrics = (("image_clustering_nmi", None, "image_clustering_nmi", 1),)
    metrics = (
        MetricInfo("image_clustering_nmi", True, False, "k-means clusters vs classes: normalised mutual information"),
        MetricInfo("image_clustering_ari", True, False, "k-means clusters vs classes: adjusted Rand index"),
    )
    samples = (SampleUnit("image", ("target", "prediction"), "an image: target its class, prediction its k-means "
                                                             "cluster",
                          recomputes="NMI and ARI = scikit-learn's scores of (`target`, `prediction`)"),)

    class Options(SeededOptions):
        """``seed``: k-means' random_state."""

    # prepare and encode: ProbeTask's (the test split's images only: k-means learns from no other split)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[EvalDataset],
              settings: ScoreSettings) -> Scored:
        import numpy as np
        from sklearn.cluster import KMeans
        from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

        from clipcache.tasks.score.evidence import clustering_evidence
        from clipcache.tasks.score.stage import check_images

        started = time.perf_counter()
        entry = store.open(encoded.outcomes["image"].ref.key)
        check_images(entry, prepared.n_samples)
        embeddings, labels = entry.embeddings(), entry.array("target")
        n_clusters = len(np.unique(labels))
        if n_clusters < 2 or len(labels) <= n_clusters:
            raise DatasetError(f"dataset {prepared.source.name!r}: clustering needs at least 2 classes and more "
                               f"images than classes ({len(labels)} images, {n_clusters} classes)")
        seed = self.Options.of(settings).seed
        clusters = KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit_predict(embeddings)
        metrics = {"image_clustering_nmi": float(normalized_mutual_info_score(labels, clusters)),
                   "image_clustering_ari": float(adjusted_rand_score(labels, clusters))}
        positions = entry.array("position")
        evidence = clustering_evidence(labels, clusters, positions, keys=sample_keys(prepared.data, positions))
        return Scored(metrics, len(labels), seconds=time.perf_counter() - started, evidence=evidence)
