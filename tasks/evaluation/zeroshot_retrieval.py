"""Zero-shot image-text retrieval, both directions (clip_benchmark's recall@k; metrics in tasks/score/retrieval.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from clipcache.tasks.contract import SampleUnit, TaskOptions, Ties
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
from clipcache.tasks.evaluation.common import check_language, encode_images_and_captions, open_for, sample_keys

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.base import EvalDataset
    from clipcache.tasks.progress import StageProgress


class ZeroShotRetrieval(EvalTask["EvalDataset"]):
    name = "zeroshot_retrieval"
    short = "retrieval"
    description = "image_retrieval_recall@k (text->image), text_retrieval_recall@k (image->text); mrr, ndcg, ranks"
    needs = ("image", "caption")
    reads = ("retrieval",)
    main_metrics = (("image_retrieval_recall", 5, "mean_retrieval_recall@5", 1),
                    ("text_retrieval_recall", 5, "mean_retrieval_recall@5", 1))
    metrics = (
        MetricInfo("image_retrieval_recall", True, True, "text->image: fraction of captions whose image is in the "
                                                         "top k"),
        MetricInfo("text_retrieval_recall", True, True, "image->text: fraction of images with any caption in the "
                                                        "top k"),
        *[m for d, q in (("image", "text->image"), ("text", "image->text")) for m in (
            MetricInfo(f"{d}_retrieval_mrr", True, True, f"{q}: mean reciprocal rank of the best positive, 0 "
                                                         f"beyond k"),
            MetricInfo(f"{d}_retrieval_ndcg", True, True, f"{q}: nDCG@k with binary relevance"),
            MetricInfo(f"{d}_retrieval_mean_rank", False, False, f"{q}: mean 1-based rank of the best positive"),
            MetricInfo(f"{d}_retrieval_median_rank", False, False, f"{q}: median 1-based rank of the best positive"),
        )],
    )
    samples = (
        *[SampleUnit(unit, ("target", "top", "rank", "score", "tied", "hits_at", "correct1", "correct5"),
                     f"{what}: target the positive ranked first (images by dataset position, captions by caption "
                     f"position; null for an image without captions), rank 1 + its rank under the stable rule, "
                     f"score its score, top the 3 best candidates (equal scores: lower index first), hits_at / "
                     f"correct1 / correct5 its hit at each requested k under --ties, tied whether a tie across the "
                     f"cut-off decided one",
                     recomputes=f"`{d}_retrieval_recall@k` = `count_if(list_contains(hits_at, k))::FLOAT / "
                                f"count(*)::FLOAT` (clip_benchmark's float32 mean); `{d}_retrieval_mrr@k`, "
                                f"`{d}_retrieval_mean_rank`, `{d}_retrieval_median_rank`{ndcg} from `rank`")
          for unit, what, d, ndcg in (
              ("text_query", "a caption (text->image; sample_index: its place in the dataset's caption order)",
               "image", " and `image_retrieval_ndcg@k`"),
              ("image_query", "an image (image->text)", "text", ""))],
        SampleUnit("image_caption", ("target", "rank"), "with --retrieval_metrics ndcg: a caption of an image "
                                                        "(sample_index the image, target the caption), rank its rank "
                                                        "in the image's ranking",
                   recomputes="image->text `text_retrieval_ndcg@k` (`tasks/score/retrieval.py: ndcg_values`, "
                              "captions in caption order)"),
    )

    class Options(TaskOptions):
        # --recall_k and --retrieval_metrics are not options: they choose which rows are reported, not their values
        ties: Ties = Field("topk", description="how tied scores are decided: topk keeps what torch.topk keeps, as "
                                               "clip_benchmark (default); stable ranks equal scores by index, "
                                               "independent of the order of the data")

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[EvalDataset]:
        dataset = open_for(self.name, source, progress)
        check_language(dataset, prompts.language)
        return Prepared(dataset, len(dataset), source)

    def encode(self, session: EncodeSession, prepared: Prepared[EvalDataset], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        return encode_images_and_captions(session, prepared, store, memo, settings, progress, sharded=sharded)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[EvalDataset],
              settings: ScoreSettings) -> Scored:
        from clipcache.tasks.score.retrieval_evidence import zeroshot_retrieval_evidence
        from clipcache.tasks.score.stage import score_retrieval

        started = time.perf_counter()
        metrics, n, tied, queries = score_retrieval(store, encoded.outcomes["image"].ref,
                                                    encoded.outcomes["caption"].ref, settings, prepared.n_samples,
                                                    ties=self.Options.of(settings).ties, keep_samples=True)
        evidence = None
        if queries is not None:
            evidence = zeroshot_retrieval_evidence(queries, settings.retrieval_metrics, resamples=settings.bootstrap,
                                                   image_keys=sample_keys(prepared.data, queries.image_index))
        return Scored(metrics, n, tied, time.perf_counter() - started, evidence=evidence)
