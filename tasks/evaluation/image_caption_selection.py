"""Image-caption selection (clip_benchmark's ``image_caption_selection``): for each item of SugarCrepe, Winoground,
ARO or VALSE (tasks/datasets/compositionality/compositionality.py), does each image pick its own caption and each
caption its own image? Metrics and their definition in tasks/score/selection.py; ``macro_acc`` for datasets with item
groups.

The images entry holds each distinct image once (SugarCrepe items share COCO images) and the caption entry each
distinct caption once (a caption repeated across items is encoded once); the item structure is the dataset's
``item_images`` and ``captions``, so a rescore reads only the cache.
"""

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
from clipcache.tasks.evaluation.common import check_language, encode_images_and_captions, open_for

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.selection import SelectionDataset
    from clipcache.tasks.progress import StageProgress


class ImageCaptionSelection(EvalTask["SelectionDataset"]):
    name = "image_caption_selection"
    short = "selection"
    description = ("image_acc, text_acc, acc (group): each image picks its caption and each caption its image; "
                   "macro_acc over item groups (ARO)")
    needs = ("image", "caption")
    reads = ("selection",)
    main_metrics = (("acc", None, "selection_acc", 1),)
    metrics = (
        MetricInfo("acc", True, True, "(no k) fraction of items whose images and captions all pick their own "
                                      "partner (Winoground's group score)"),
        MetricInfo("image_acc", True, False, "image_caption_selection: fraction of items whose captions each pick "
                                             "their own image (Winoground's image score)"),
        MetricInfo("text_acc", True, False, "image_caption_selection: fraction of items whose images each pick "
                                            "their own caption (Winoground's text score)"),
        MetricInfo("macro_acc", True, False, "image_caption_selection over grouped items (ARO's VG-Relation and "
                                             "VG-Attribution): mean over the qualifying groups of the group's "
                                             "text_acc (ARO's macro accuracy)"),
    )
    samples = tuple(
        SampleUnit(unit, ("correct1", "tied", "margin"), f"an item (sample_key: SugarCrepe's or Winoground's id): "
                                                         f"correct1 its {score}, tied whether a tied maximum "
                                                         f"decided it, margin its smallest gap to a rival (NaN "
                                                         f"without one: SugarCrepe's image side)",
                   recomputes=f"`{metric}` = `avg(correct1)::FLOAT` (clip_benchmark averages in float32){more}")
        for unit, score, metric, more in (
            ("item", "group outcome", "acc", "; `tied_queries` of `acc` = the rows' `tied`"),
            ("item_text", "text outcome", "text_acc", ""), ("item_image", "image outcome", "image_acc", "")))

    def prepare(self, source: DataSource, prompts: PromptSettings,
                progress: StageProgress) -> Prepared[SelectionDataset]:
        from clipcache.storage.errors import DatasetError
        from clipcache.tasks.datasets.selection import SelectionDataset

        dataset = open_for(self.name, source, progress)
        check_language(dataset, prompts.language)
        if not isinstance(dataset, SelectionDataset):
            raise DatasetError(f"dataset {source.name!r} is not an image-caption selection set (no items)")
        return Prepared(dataset, dataset.n_items, source)

    def encode(self, session: EncodeSession, prepared: Prepared[SelectionDataset], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        return encode_images_and_captions(session, prepared, store, memo, settings, progress, sharded=sharded)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[SelectionDataset],
              settings: ScoreSettings) -> Scored:
        from clipcache.tasks.score.evidence import selection_evidence
        from clipcache.tasks.score.stage import score_selection

        started = time.perf_counter()
        dataset = prepared.data
        metrics, n, tied, samples = score_selection(store, encoded.outcomes["image"].ref,
                                                    encoded.outcomes["caption"].ref, dataset.item_images,
                                                    len(dataset.sources), keep_samples=True,
                                                    targets=dataset.targets, strict=dataset.strict)
        if dataset.groups is not None and samples is not None:  # ARO's VG sets: the macro accuracy they report
            from clipcache.tasks.score.selection import grouped_accuracy

            metrics["macro_acc"] = grouped_accuracy(samples["text_right"],
                                                    [dataset.groups[i] for i in samples["sample_index"]],
                                                    exclude=dataset.macro_exclude, min_count=dataset.macro_min_count)
        if samples is not None:  # CREPE's per complexity, VL-CheckList's per subtype (compositionality_more.py)
            metrics.update(dataset.group_metrics(samples))
        evidence = None
        if samples is not None:
            keys = [dataset.item_keys[i] for i in samples["sample_index"]] if dataset.item_keys else None
            evidence = selection_evidence(samples, resamples=settings.bootstrap, keys=keys)
        return Scored(metrics, n, tied, time.perf_counter() - started, evidence=evidence)
