"""Composed image retrieval (CIRR, FashionIQ style; MIEB's CIRRIT2IRetrieval and FashionIQIT2IRetrieval): each query
is a reference image plus a modifying text, fused as mteb's CLIP-style wrappers fuse them, retrieving the split's
images; recall@k (and MIEB's main score, nDCG@10). The rule is in tasks/score/composed_retrieval.py; the layouts
(CIRR's, FashionIQ's and MIEB's own files) in tasks/datasets/mieb/composed_layouts.py.

Two cache entries: every distinct image, gallery and references together (``composed_image``: CIRR's and FashionIQ's
references are gallery images, encoded once), and every distinct modifying text (``modifier_text``, keyed by the
texts themselves). A rescore reads the folder's annotations and the cache only. Each query is a sample row (unit
``query``): its target's gallery position in ``target``, its ``rank``, ``score``, ``top``, ``hits_at`` and ``tied``;
each judged target a ``relevant_doc`` row; for CIRR each query also a ``subset_query`` row (its target's 1-based
``rank`` among its img_set less the reference, null when the target is no member; ``hits_at`` 1, 2, 3; ``tied``).

The fused query sums raw features (each entry's normalised row x its stored norm), as mteb's CLIP-style wrappers
sum theirs; an entry written before norms were kept (or by a model that gave none) is fused from normalised rows,
with a warning naming the command that deletes it (:func:`fusion_sides`, shared with multiple_choice).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

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
    TaskOptions,
)
from clipcache.tasks.evaluation.common import RANKED_QUERY, RELEVANT_DOC
from clipcache.tasks.score.metrics import RANKING_METRICS

if TYPE_CHECKING:
    import numpy as np

    from clipcache.storage.cache_entry import EmbeddingEntry
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.mieb.composed_layouts import ComposedData
    from clipcache.tasks.progress import StageProgress
    from clipcache.tasks.score.composed_retrieval import Subsets
    from clipcache.tasks.score.evidence import Evidence

log = logging.getLogger("clipcache.evaluation")

IMAGE, TEXT = "composed_image", "modifier_text"
K_ALWAYS = (1, 5, 10, 50)  # CIRR reports recall@1/5/10/50, FashionIQ recall@10/50
MAIN_K = 10  # nDCG@10: MIEB's main score for both tasks
SUBSET_K = (1, 2, 3)  # CIRR's Recall_subset@1/2/3


def fusion_sides(image: EmbeddingEntry, text: EmbeddingEntry, n_texts: int, task: str,
                 name: str) -> tuple[np.ndarray, np.ndarray]:
    """(image rows, text rows) as an image + text query sums them: the raw features (the stored raw rows, else
    normalised row x stored norm), what mteb's CLIP, OpenCLIP and SigLIP wrappers add. When either entry keeps no norms (written before clipcache
    kept them, or by a model that gave none), both sides' normalised rows, as before norms were kept, with a warning
    naming the command that deletes the entry (the next run re-encodes it with norms)."""
    from clipcache.tasks.score.cached_rows import text_vectors

    texts = text_vectors(text, n_texts)  # checks the entry fits the data
    if image.has_norms and text.has_norms:
        return image.raw_embeddings(task), text.raw_embeddings(task)
    bare = [e for e in (image, text) if not e.has_norms]
    log.warning("%s: cache entry %s keeps no norms: the image + text query sums normalised vectors, where mteb sums "
                "raw features (delete it with `%s` and run again for mteb's fusion)", name, bare[0].key[:12],
                bare[0].remedy("rm"))
    return image.embeddings(), texts


class ComposedRetrieval(EvalTask["ComposedData"]):
    name = "composed_retrieval"
    short = "composed"
    description = "reference image + modifying text -> target image (CIRR, FashionIQ; MIEB it2i): recall@k, ndcg@10"
    needs = (IMAGE, TEXT)
    main_metrics = (("recall", 10, "composed_recall@10", 1),)
    metrics = (
        *[m for m in RANKING_METRICS if m.name in ("recall", "ndcg")],
        MetricInfo("recall_subset", True, True, "composed_retrieval on CIRR: fraction of queries whose target is "
                                                "within the first k of its img_set less the reference image, in the "
                                                "full ranking's order (CIRR's Recall_subset@k)"),
        MetricInfo("cirr_avg", True, False, "composed_retrieval on CIRR: (recall@5 + recall_subset@1) / 2, CIRR's "
                                            "reported main number (its 'Avg')"),
    )
    samples = (
        replace(RANKED_QUERY, columns=(*RANKED_QUERY.columns, "tied")), RELEVANT_DOC,
        SampleUnit("subset_query", ("target", "rank", "tied", "hits_at"), "CIRR: a query ranked within its img_set "
                                                                          "(recall_subset@k counts hits_at)"),
    )

    class Options(TaskOptions):
        reference_image: Literal["layout", "exclude", "keep"] = Field(
            "layout", description="whether a query's reference image is a candidate: exclude (CIRR's own "
                                  "evaluation), keep (MIEB's), or layout: exclude for CIRR's files, keep for "
                                  "FashionIQ's and MIEB's")

    def serves(self, role: str, kind: str) -> bool:
        return role in self.needs  # no other task writes these roles

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[ComposedData]:
        from clipcache.tasks.datasets.mieb.composed_layouts import open_composed
        from clipcache.tasks.evaluation.common import dataset_root

        root = dataset_root(source, self.name, "a folder with CIRR's, FashionIQ's or "
                            "MIEB's composed-retrieval files")
        data = open_composed(source.name, root, source.split, source.limit)
        return Prepared(data, len(data.targets), source)

    def encode(self, session: EncodeSession, prepared: Prepared[ComposedData], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.evaluation.common import encode_images_and_texts

        data = prepared.data
        return encode_images_and_texts(session, data, store, memo, settings, progress, limit=prepared.source.limit,
                                       fmt="composed_retrieval", image_role=IMAGE, image_what="composed-query image",
                                       texts={TEXT: (data.texts, "modifier", "modifying text")})

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[ComposedData],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.score.cached_rows import image_rows
        from clipcache.tasks.score.composed_retrieval import composed_ranks
        from clipcache.tasks.score.retrieval_evidence import text_retrieval_evidence
        from clipcache.tasks.score.text_retrieval import per_query_metrics

        started = time.perf_counter()
        data = prepared.data
        choice = self.Options.of(settings).reference_image
        exclude = data.excludes_reference if choice == "layout" else choice == "exclude"
        entry = store.open(encoded.outcomes[IMAGE].ref.key)
        rows = image_rows(entry, len(data.images))
        raw, texts = fusion_sides(entry, store.open(encoded.outcomes[TEXT].ref.key), len(data.texts), self.name,
                                  data.name)
        # an undecodable gallery image leaves the gallery; a query whose reference did not decode is not asked, and
        # one left without a target is not scored (pytrec_eval skips queries without a relevant document)
        in_gallery = rows[data.gallery] >= 0
        position = np.cumsum(in_gallery) - 1
        asked, targets, gains = [], [], []
        for q in range(len(data.targets)):
            keep = in_gallery[data.targets[q]]
            if rows[data.query_image[q]] >= 0 and keep.any():
                asked.append(q)
                targets.append(position[data.targets[q][keep]])
                gains.append(data.gains[q][keep])
        if not asked:
            raise DatasetError(f"dataset {data.name!r}: no query is left with a decodable reference and target")
        kept = np.asarray(asked, np.int64)
        reference = data.reference[kept]
        excluded = np.where((reference >= 0) & in_gallery[np.maximum(reference, 0)], position[reference], -1) \
            if exclude else None
        gallery_ids = [i for i, ok in zip(data.gallery_ids, in_gallery, strict=True) if ok]
        subsets = None
        if data.subsets is not None:  # CIRR: each query's img_set less its reference, in the decodable gallery
            # (a reference that is its own target stays, as in the full ranking)
            subsets = [position[m[((m != reference[j]) | np.isin(m, data.targets[q])) & in_gallery[m]]]
                       for j, (q, m) in enumerate((q, data.subsets[q]) for q in asked)]
        # the gallery's raw rows too (normalised when the entry keeps no norms): cosine does not see a document's
        # norm, but normalising the raw vectors, as mteb does with its wrappers' output, gives mteb's bits
        result = composed_ranks(raw[rows[data.query_image[kept]]], texts[data.query_text[kept]],
                                raw[rows[data.gallery[in_gallery]]], targets, gains, gallery_ids=gallery_ids,
                                excluded=excluded, subsets=subsets)
        ks = sorted(set(settings.recall_k) | set(K_ALWAYS))
        values = per_query_metrics(result.ranked.ranks, result.ranked.gains, sorted({*ks, MAIN_K}))
        reported = {f"recall@{k}": values[f"recall@{k}"] for k in ks} | {"ndcg@10": values["ndcg@10"]}
        if result.subset is not None:
            reported |= {f"recall_subset@{k}": result.subset.recall(k) for k in SUBSET_K}
            # CIRR's main number ("Avg"): the mean of Recall@5 and Recall_subset@1, here per query
            reported["cirr_avg"] = (values["recall@5"] + reported["recall_subset@1"]) / 2
        metrics = {name: float(v.mean()) for name, v in reported.items()}
        # rows name gallery images by their position in the layout's gallery
        result.ranked.relevant = [np.flatnonzero(in_gallery)[t] for t in targets]
        result.ranked.top = np.flatnonzero(in_gallery)[result.ranked.top]
        evidence = text_retrieval_evidence(result.ranked, reported, ks, query_index=kept,
                                           query_ids=[data.keys[q] for q in asked] if data.keys else
                                           [str(q) for q in asked], resamples=settings.bootstrap)
        evidence.columns["tied"] = np.logical_or.reduce([result.tied(k) for k in ks])
        tied = {f"recall@{k}": int(result.tied(k).sum()) for k in ks}
        if result.subset is not None:
            evidence.more.append(_subset_evidence(result.subset, evidence.columns["target"], kept, evidence.keys))
            tied |= {f"recall_subset@{k}": int(result.subset.tied(k).sum()) for k in SUBSET_K}
        skipped = len(data.images) - entry.count
        if skipped:
            metrics["skipped_images"] = float(skipped)
        return Scored(metrics, len(asked), {m: t for m, t in tied.items() if t}, time.perf_counter() - started,
                      evidence=evidence)


def _subset_evidence(subset: Subsets, target: np.ndarray, kept: np.ndarray, keys: list[str] | None) -> Evidence:
    """CIRR's Recall_subset rows (unit ``subset_query``), so the stored recall_subset@k recompute from them."""
    import numpy as np

    from clipcache.storage.arrow_columns import Ragged
    from clipcache.tasks.score.evidence import Evidence

    ranks = np.array([int(r[0]) for r in subset.ranks], np.int64)  # CIRR: one target per query
    hits = np.stack([(ranks >= 0) & (ranks < k) for k in SUBSET_K], axis=1)
    rank: np.ndarray = ranks + 1
    if (ranks < 0).any():  # a target that is no member of its img_set: no rank (null)
        rank = np.ma.MaskedArray(rank, mask=ranks < 0)
    tied = np.logical_or.reduce([subset.tied(k) for k in SUBSET_K])
    columns: dict[str, Any] = {"sample_index": kept.astype(np.int64), "target": np.asarray(target, np.int64),
                               "rank": rank, "tied": tied, "hits_at": Ragged.from_mask(hits, list(SUBSET_K))}
    return Evidence("subset_query", columns, keys)
