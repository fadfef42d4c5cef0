"""Zero-shot classification: image embeddings against a classifier built from class-name prompts (clip_benchmark's
definition; metrics in tasks/score/classification.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

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
from clipcache.tasks.evaluation.common import (
    CLASSIFIED_IMAGE,
    METADATA_LINK,
    class_prompts,
    encode_split_images,
    open_for,
    sample_keys,
)
from clipcache.tasks.suites.group_metrics import GROUP_METRICS

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.base import EvalDataset
    from clipcache.tasks.progress import StageProgress


class ZeroShotClassification(EvalTask["EvalDataset"]):
    name = "zeroshot_classification"
    short = "classification"
    description = "acc1, acc5, mean_per_class_recall (mean_average_precision for multilabel datasets)"
    needs = ("image", "prompt")
    reads = ("classification",)
    uses_prompts = True
    main_metrics = (("acc", 1, "acc1", 1), ("mean_average_precision", None, "mean_average_precision", 2))
    metrics = (
        MetricInfo("acc", True, True, "fraction of samples whose true class is among the k highest logits"),
        MetricInfo("mean_per_class_recall", True, False, "mean over classes present in the targets of per-class "
                                                         "recall of the argmax (balanced accuracy)"),
        MetricInfo("mean_average_precision", True, False, "mean over classes of average precision (multilabel)"),
        *GROUP_METRICS,  # DataComp's group metrics, for the datasets it groups
    )
    samples = (
        SampleUnit("image", CLASSIFIED_IMAGE, "a test image: its class, the argmax, the classes topk keeps (best "
                                              "first), correct1 / correct5 (what acc1 / acc5 count), its class's "
                                              "logit, rank, tie and margin over the best other class"),
        SampleUnit("class", ("target", "value"), "multilabel datasets: a class (sample_index and target its id, "
                                                 "sample_key its name), value its average precision",
                   recomputes="`mean_average_precision` = the float32 mean of `value` (torch's, as clip_benchmark's "
                              "APMeter; `avg(value)` agrees to ~1e-7)"),
        METADATA_LINK,  # DataComp's grouped datasets
    )

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[EvalDataset]:
        dataset = open_for(self.name, source, progress)
        chosen, default = class_prompts(dataset, prompts)
        return Prepared(dataset, len(dataset), source, chosen, default, chosen.sha256)

    def encode(self, session: EncodeSession, prepared: Prepared[EvalDataset], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.encode.stage import encode_prompts

        started = time.perf_counter()
        dataset = prepared.data
        images = encode_split_images(session, dataset, store, memo, settings, progress,
                                     limit=prepared.source.limit, sharded=(sharded or {}).get("image"))
        chosen = prepared.class_prompts()
        prompts = encode_prompts(session, chosen.prompts(), store, settings.batch_size, progress, dataset.name)
        return Encoded({"image": images, "prompt": prompts}, {"n_classes": len(chosen.classnames),
                                                              "n_templates": len(chosen.templates)},
                       time.perf_counter() - started)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[EvalDataset],
              settings: ScoreSettings) -> Scored:
        from clipcache.tasks.score.evidence import classification_evidence, multilabel_evidence
        from clipcache.tasks.score.stage import score_classification

        started = time.perf_counter()
        metrics, n, samples = score_classification(store, encoded.outcomes["image"].ref, encoded.outcomes["prompt"],
                                                   n_classes=encoded.info["n_classes"],
                                                   n_templates=encoded.info["n_templates"], settings=settings,
                                                   n_samples=prepared.n_samples, keep_samples=True)
        evidence = None
        if samples and "average_precision" in samples:  # multilabel: rows of classes, their average precision
            evidence = multilabel_evidence(samples["average_precision"], samples["logits"], samples["multi_hot"],
                                           resamples=settings.bootstrap, classnames=prepared.class_prompts().classnames)
        elif samples:
            evidence = classification_evidence(samples, encoded.info["n_classes"], resamples=settings.bootstrap,
                                               keys=sample_keys(prepared.data, samples["sample_index"]))
            if hasattr(prepared.data, "sample_metadata"):  # per-sample groups: DataComp's group metrics
                from clipcache.tasks.suites import groups

                metrics = groups.attach(evidence, metrics, prepared.data.name, prepared.data.sample_metadata(),
                                        samples, resamples=settings.bootstrap)
        return Scored(metrics, n, seconds=time.perf_counter() - started, evidence=evidence)

