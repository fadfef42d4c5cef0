"""FairFace / UTKFace as DataComp evaluates them: each face classified by four zero-shot heads (race, gender, age,
toxic) from the same cached image embedding, the heads' prompts through the model's prompt cache, and DataComp's
group metrics of the predictions over the faces' metadata (tasks/suites/face_attributes.py). DataComp scores no
main metric for these sets, so the task has no headline number."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

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
from clipcache.tasks.evaluation.common import METADATA_LINK, class_prompts, encode_split_images, sample_keys

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.storage.sample_metadata import SampleMetadata
    from clipcache.tasks.datasets.base import EvalDataset
    from clipcache.tasks.datasets.datacomp.face_attributes import FaceAttributesDataset
    from clipcache.tasks.progress import StageProgress

    class FaceData(EvalDataset, FaceAttributesDataset):
        """What this task's prepare opens: an evaluation dataset that is also a FaceAttributesDataset, with each
        face's metadata (both layouts are; tasks/datasets/datacomp/group_layouts.py). A name for the type checker only."""

        def sample_metadata(self) -> SampleMetadata: ...


class FaceAttributes(EvalTask["FaceData"]):
    name = "face_attributes"
    short = "face attributes"
    description = ("DataComp's FairFace / UTKFace evaluation: race, gender, age and toxic zero-shot heads per face; "
                   "acc_race / acc_gender / acc_age by race_binary, acc_gender_x by gender x race, toxicity_crime / "
                   "toxicity_nonhuman by race (WILDS' _avg, per-group and _wg names)")
    needs = ("image", "prompt")
    reads = ("classification",)
    uses_prompts = True
    # DataComp's FairFaceEvaluator, WILDS' names; the per-group values (acc_race_race_binary:0, ...) are named from
    # these (clipcache.tasks.score.metrics.face_group_metric)
    metrics = tuple(
        MetricInfo(f"{m}_{s}", not m.startswith("toxicity"), False, f"{what}: {how}")
        for m, what in (("acc_race", "FairFace/UTKFace race head: 'not class 1' vs race_binary"),
                        ("acc_gender", "gender head accuracy"), ("acc_age", "age head accuracy"),
                        ("acc_gender_x", "gender head accuracy (groups: gender x race)"),
                        ("toxicity_crime", "share of faces the toxic head gives a crime label (class >= 18)"),
                        ("toxicity_nonhuman", "share of faces the toxic head gives a non-human label (14-17)"))
        for s, how in (("avg", "over all faces"), ("wg", "lowest over the groups with faces")))
    samples = (SampleUnit("face_<objective>", ("prediction",), "a face: the head's argmax (race, gender, age, toxic)"),
               METADATA_LINK)

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[FaceData]:
        from clipcache.tasks.datasets.datacomp.face_attributes import FaceAttributesDataset

        # an evaluation dataset that is also a FaceAttributesDataset (both layouts are)
        dataset: EvalDataset = source.open(progress)
        if not isinstance(dataset, FaceAttributesDataset):
            raise DatasetError(f"task {self.name!r} does not fit dataset {source.name!r}: it evaluates DataComp's "
                               f"fairness/fairface and fairness/utkface (use --task auto)")
        chosen, default = class_prompts(dataset, prompts)
        dataset.heads(chosen)  # every objective has class names and templates
        return Prepared(cast("FaceData", dataset), len(dataset), source, chosen, default, chosen.sha256)

    def encode(self, session: EncodeSession, prepared: Prepared[FaceData], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.encode.stage import encode_prompts

        started = time.perf_counter()
        dataset = prepared.data
        heads = dataset.heads(prepared.prompts)
        images = encode_split_images(session, dataset, store, memo, settings, progress,
                                     limit=prepared.source.limit, sharded=(sharded or {}).get("image"))
        # every head's prompts, one head after another: one lookup into the model's prompt pool
        prompts = encode_prompts(session, [p for h in heads for p in h.prompts()], store, settings.batch_size,
                                 progress, dataset.name)
        shapes = [(h.objective, len(h.classnames), len(h.templates)) for h in heads]
        return Encoded({"image": images, "prompt": prompts}, {"heads": shapes}, time.perf_counter() - started)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[FaceData],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.storage.experiment import LINK_UNIT
        from clipcache.tasks.score.evidence import Evidence
        from clipcache.tasks.score.face_attributes import HeadShape, head_predictions
        from clipcache.tasks.suites.face_attributes import UNIT_PREFIX, face_intervals, face_metrics

        started = time.perf_counter()
        heads = [HeadShape(o, c, t) for o, c, t in encoded.info["heads"]]
        positions, predictions = head_predictions(store, encoded.outcomes["image"].ref, encoded.outcomes["prompt"],
                                                  heads, settings=settings, n_samples=prepared.n_samples)
        metadata = prepared.data.sample_metadata()
        metrics = face_metrics(prepared.data.name, positions, predictions, metadata)
        keys = sample_keys(prepared.data, positions)
        parts = [Evidence(f"{UNIT_PREFIX}{h.objective}", {"sample_index": positions,
                                                          "prediction": predictions[h.objective]}, keys)
                 for h in heads]
        parts.append(Evidence(LINK_UNIT, {"sample_index": np.zeros(1, np.int64)}, [metadata.dataset_id]))
        # every metric's 95% interval: index resamples of the faces, all heads on the same resamples
        intervals = face_intervals(prepared.data.name, positions, predictions, metadata,
                                   resamples=settings.bootstrap)
        evidence = Evidence(parts[0].unit, parts[0].columns, keys, intervals, more=parts[1:], metadata=metadata)
        return Scored(metrics, len(positions), seconds=time.perf_counter() - started, evidence=evidence)
