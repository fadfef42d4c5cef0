"""Visual document retrieval (ViDoRe; MIEB's ``Vidore*Retrieval`` tasks): text queries against page images, nDCG@5
the main score, with MAP, recall, precision and MRR at mteb's k values (1, 3, 5, 10, 20, 100, 1000) beside it.

The layouts (ViDoRe v1's question-answering rows, or the BEIR-style corpus / queries / qrels Parquet files of
ViDoRe v2 and of MIEB's copies) are read by tasks/datasets/mieb/vidore.py into the any-to-any retrieval data, so this is
the any-to-any task (tasks/evaluation/any2any_retrieval.py) with its cache entries and scoring: the distinct page
images are one entry (role ``corpus_image``) and the distinct query texts another (``query_text``). A page goes
through the model's own preprocessing (its resize and crop) from the decoded page, as mteb hands the page to the
model; a page that does not decode is one line naming its Parquet file and row.

The numbers are mteb's (``AbsTaskRetrieval`` with pytrec_eval): the corpus is ordered so that exactly equal scores
rank as pytrec_eval ranks them (document id descending), and a query whose judgments are all 0 counts as 0 in every
mean, as pytrec_eval scores it. mteb rounds to 5 decimals; these are not rounded.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from clipcache.tasks.evaluation.any2any_retrieval import Any2AnyRetrieval
from clipcache.tasks.evaluation.base import DataSource, Encoded, Prepared, PromptSettings, Scored, ScoreSettings
from clipcache.tasks.evaluation.common import RANKED_QUERY, RELEVANT_DOC

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.datasets.any2any import Any2AnyData
    from clipcache.tasks.datasets.mieb.vidore import VidoreData
    from clipcache.tasks.progress import StageProgress

K_VALUES = (1, 3, 5, 10, 20, 100, 1000)  # mteb's AbsTaskRetrieval.k_values
log = logging.getLogger("clipcache.visual_document_retrieval")


class VisualDocumentRetrieval(Any2AnyRetrieval):
    name = "visual_document_retrieval"
    short = "vidore"
    description = "text queries against page images (ViDoRe): ndcg@5, map, recall, precision, mrr at mteb's k"
    needs = ("corpus_image", "query_text")
    reads = ("any2any",)
    main_metrics = (("ndcg", 5, "ndcg@5", 1),)
    # the rows recompute the metrics only when every query has a relevant document (see score): no such claim here
    samples = (RANKED_QUERY, RELEVANT_DOC)

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[Any2AnyData]:
        from clipcache.tasks.datasets.mieb.vidore import open_vidore
        from clipcache.tasks.evaluation.common import dataset_root

        root = dataset_root(source, self.name, "a snapshot of a ViDoRe dataset "
                            "(data/<split>-*.parquet with query and image, or corpus/, queries/ and qrels/ "
                            "Parquet files)")
        data = open_vidore(source.name, root, source.split, source.limit, source.language)
        return Prepared(data, len(data.queries.ids) + data.unjudged, source)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[Any2AnyData],
              settings: ScoreSettings) -> Scored:
        scored = super().score(store, encoded, prepared,
                               replace(settings, recall_k=tuple(sorted({*settings.recall_k, *K_VALUES}))))
        unjudged = cast("VidoreData", prepared.data).unjudged  # what this task's prepare opened
        if not unjudged:
            return scored
        # pytrec_eval scores a query whose judgments are all 0 as 0 on every metric, and mteb averages over it
        judged = scored.n_samples
        share = judged / (judged + unjudged)
        metrics = {name: value * share if "@" in name else value for name, value in scored.metrics.items()}
        log.warning("%s: %d queries have only judgments of 0: they count 0 in every mean, as in mteb, and have no "
                    "sample rows; the intervals are left out", prepared.data.name, unjudged)
        if scored.evidence is not None:
            for part in scored.evidence.parts():
                part.intervals = {}
        return replace(scored, metrics=metrics, n_samples=judged + unjudged)
