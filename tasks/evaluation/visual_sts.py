"""Visual STS (MIEB's VisualSTS family: STS12-17 and STS-B rendered as images): how well the cosine similarity of
two images' embeddings ranks pairs as people scored their similarity. Metrics and their definitions, mteb's exactly,
in tasks/score/sts.py; the layouts (``pairs.jsonl``, or MIEB's Parquet files) in tasks/datasets/mieb/mieb_layouts.py.

The images of both sides are one cache entry (role ``pair_image``; a file, or Parquet cells with the same bytes, used by
several pairs is encoded once),
so a rescore reads the folder's gold scores and the cache only. The similarities are taken on the raw features
(the model's output, kept in the entry; normalised row x its stored norm for entries of earlier releases), as mteb's
CLIP-style wrappers give them to its evaluator. Each pair is a sample row (unit ``pair``: its cosine
similarity in ``score``, its gold score as given in ``value``), from which every stored correlation recomputes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import DatasetError
from clipcache.tasks.contract import SampleUnit
from clipcache.tasks.evaluation.base import (
    DataSource,
    Encoded,
    EncodeSession,
    EncodeSettings,
    EvalTask,
    MetricInfo,
    Prepared,
    PromptSettings,
    Scored,
    ScoreSettings,
)

if TYPE_CHECKING:
    import numpy as np

    from clipcache.storage.embedding_store import EmbeddingEntry, EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.mieb.mieb_layouts import VisualStsData
    from clipcache.tasks.progress import StageProgress

ROLE = "pair_image"
log = logging.getLogger("clipcache.visual_sts")


class VisualSts(EvalTask["VisualStsData"]):
    name = "visual_sts"
    short = "visual_sts"
    description = ("cosine_spearman, cosine_pearson, manhattan_* and euclidean_*: image-pair similarity vs gold "
                   "scores (MIEB VisualSTS)")
    needs = (ROLE,)
    main_metrics = (("cosine_spearman", None, "cosine_spearman", 1),)
    metrics = (
        *[MetricInfo(f"{s}_{c}", True, False, f"visual_sts: {n} correlation of gold scores and the pairs' {s} "
                     f"similarity{'' if s == 'cosine' else ' (negated distance)'} (mteb's STS)")
          for s in ("cosine", "manhattan", "euclidean") for c, n in (("spearman", "Spearman"), ("pearson", "Pearson"))],
    )
    samples = (SampleUnit("pair", ("score", "value"), "an image pair: its cosine similarity and its gold score"),)

    def serves(self, role: str, kind: str) -> bool:
        return role == ROLE  # no other task writes this role

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[VisualStsData]:
        from clipcache.tasks.datasets.mieb.mieb_layouts import open_visual_sts
        from clipcache.tasks.evaluation.common import dataset_root

        root = dataset_root(source, self.name, "a folder with pairs.jsonl (image1, image2, score) "
                            "or MIEB's Parquet files (data/<split>-*.parquet)")
        data = open_visual_sts(source.name, root, source.split, source.limit)
        _enough_pairs(data.name, len(data.gold))
        return Prepared(data, len(data.gold), source)

    def encode(self, session: EncodeSession, prepared: Prepared[VisualStsData], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.encode.stage import check_cached, encode_images, image_key_fields

        started = time.perf_counter()
        data = prepared.data
        fields = {**image_key_fields(session, data.images.identity(memo), data.split, prepared.source.limit),
                  "role": ROLE}
        memo.save()
        if settings.cached_only:
            check_cached(store, [(fields, f"pair image embeddings of {data.name}")])
        images = encode_images(session, data.images, store, fields, settings, progress, raw=True)
        return Encoded({ROLE: images}, seconds=time.perf_counter() - started)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[VisualStsData],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.score.cached_rows import image_rows
        from clipcache.tasks.score.evidence import Evidence
        from clipcache.tasks.score.sts import pair_similarities, sts_correlations, sts_intervals

        started = time.perf_counter()
        data = prepared.data
        entry = store.open(encoded.outcomes[ROLE].ref.key)
        rows = image_rows(entry, len(data.images))[data.pairs]  # (pairs, 2)
        kept = np.flatnonzero((rows >= 0).all(axis=1))  # a pair with an undecodable image leaves the set
        _enough_pairs(data.name, len(kept))
        vectors = _features(entry, data.name)
        similarities = pair_similarities(vectors[rows[kept, 0]], vectors[rows[kept, 1]])
        gold = [data.gold[i] for i in kept]
        metrics = sts_correlations(gold, similarities)
        skipped = len(data.images) - entry.count
        if skipped:
            metrics["skipped_images"] = float(skipped)
        columns = {"sample_index": kept.astype(np.int64), "score": similarities["cosine"].astype(np.float64),
                   "value": np.asarray(gold, np.float64)}
        keys = [data.keys[i] for i in kept] if data.keys else None
        evidence = Evidence("pair", columns, keys,
                            sts_intervals(gold, similarities["cosine"], resamples=settings.bootstrap))
        return Scored(metrics, len(kept), seconds=time.perf_counter() - started, evidence=evidence)


def _features(entry: EmbeddingEntry, name: str) -> np.ndarray:
    """The raw features (the stored raw rows, else normalised row x norm), what mteb's CLIP-style wrappers hand its
    STS evaluator: Manhattan
    and Euclidean distances see the norms. An entry that keeps no norms scores its normalised rows, as before norms
    were kept (cosine does not see them), and says so."""
    if entry.has_norms:
        return entry.raw_embeddings("visual_sts")
    log.warning("%s: cache entry %s keeps no norms: manhattan_* and euclidean_* are on the normalised embeddings "
                "(delete it with `%s` and run again for mteb's raw features)", name, entry.key[:12], entry.remedy("rm"))
    return entry.embeddings()


def _enough_pairs(name: str, n: int) -> None:
    if n < 2:  # mteb fails here too: scipy's pearsonr needs two
        raise DatasetError(f"dataset {name!r}: visual STS needs at least 2 pairs to correlate, {n} to score")
