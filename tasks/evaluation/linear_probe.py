"""Linear probe: a logistic-regression layer trained on cached image features of the train split, tested on the test
split (clip_benchmark's definition; tasks/score/linear_probe.py).

It reads the same cache entries as zero-shot classification: the test split's image entry is the one
``zeroshot_classification`` wrote, and the train (and val) split entries are image entries like any other. So a probe
after a zero-shot run encodes only the train split, and a second probe with other settings encodes nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, ClassVar, Self

from pydantic import Field, PositiveInt, field_validator, model_validator

from clipcache.tasks.contract import BATCH_SIZE, SampleUnit, SeededOptions, TaskOptions
from clipcache.tasks.evaluation.base import Encoded, EncodeSettings, MetricInfo, Prepared, Scored, ScoreSettings
from clipcache.tasks.evaluation.common import CLASSIFIED_IMAGE, sample_keys
from clipcache.tasks.evaluation.probes import ProbeTask

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.datasets.base import EvalDataset


_SEED = SeededOptions.model_fields["seed"]  # one default and help for every seeded task
_SEVERAL_K = "several values give one probe (one experiment) each over the same cached features"


class LinearProbe(ProbeTask):
    name = "linear_probe"
    short = "linear probe"
    description = "lp_acc1, lp_acc5, lp_mean_per_class_recall of a linear layer trained on cached train features"
    main_metrics = (("lp_acc", 1, "lp_acc1", 1),)
    metrics = (
        MetricInfo("lp_acc", True, True, "linear probe: fraction of test samples whose class is among the probe's k "
                                         "highest logits"),
        MetricInfo("lp_mean_per_class_recall", True, False, "linear probe: balanced accuracy of the probe's argmax"),
    )
    samples = (SampleUnit("image", CLASSIFIED_IMAGE, "a test image, with the columns of zero-shot classification "
                                                     "from the probe's logits",
                          recomputes="`lp_acc1` / `lp_acc5` = `avg(correct1)` / `avg(correct5)`, "
                                     "`lp_mean_per_class_recall` = balanced accuracy of `prediction`"),)

    class Options(TaskOptions):
        """clip_benchmark's flags of the same names, with its defaults, in its order. ``seed`` (SeededOptions')
        seeds the layer's initialisation, the batch order, the few-shot pick and the val_proportion split."""

        encode_fields: ClassVar[tuple[str, ...]] = ("train_split", "val_split")
        swept: ClassVar[dict[str, str]] = {"fewshot_k": _SEVERAL_K}  # --fewshot_k 1 5 10: three experiments

        train_split: str = Field("train", description="the split the probe learns from")
        val_split: str | None = Field(None, description="a split to choose the weight decay on (clip_benchmark's "
                                                        "sweep); exclusive with val_proportion")
        val_proportion: float | None = Field(None, gt=0, lt=1, description="the share of the train split held out "
                                                                            "to choose the weight decay")
        fewshot_k: int = Field(-1, ge=-1, description="training samples per class (-1: all, else >= 1)")
        fewshot_lr: float = Field(0.1, gt=0, description="learning rate (AdamW, cosine schedule)")
        fewshot_epochs: PositiveInt = Field(10, description="epochs")
        seed: int = Field(_SEED.default, description=_SEED.description)
        batch_size: PositiveInt = Field(BATCH_SIZE, description="training batch size (the run's --batch_size)")

        @field_validator("fewshot_k")
        @classmethod
        def _all_or_some(cls, value: int) -> int:
            if value == 0:
                raise ValueError("0 samples per class trains nothing: give -1 (all) or a number >= 1")
            return value

        @model_validator(mode="after")
        def _one_validation_source(self) -> Self:
            if self.val_split is not None and self.val_proportion is not None:
                raise ValueError("val_split and val_proportion: give one of them (as clip_benchmark)")
            return self

    def learn_splits(self, settings: EncodeSettings) -> dict[str, str]:
        options = self.Options.of(settings)
        return {role: split for role, split in (("train", options.train_split), ("val", options.val_split))
                if split is not None}

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[EvalDataset],
              settings: ScoreSettings) -> Scored:
        import numpy as np
        import torch

        from clipcache.tasks.score.evidence import classification_evidence
        from clipcache.tasks.score.linear_probe import ProbeSettings, held_out_split, probe
        from clipcache.tasks.score.stage import check_images

        started = time.perf_counter()
        options = self.Options.of(settings)
        features = {}
        positions = np.zeros(0, dtype=np.int64)
        for role, outcome in encoded.outcomes.items():
            entry = store.open(outcome.ref.key)
            if role == "image":
                check_images(entry, prepared.n_samples)
                positions = np.asarray(entry.array("position"), np.int64)
            features[role] = (torch.from_numpy(entry.embeddings()), torch.from_numpy(entry.array("target")).long())
        train_x, train_y = features["train"]
        val_x, val_y = features.get("val", (None, None))
        if options.val_proportion is not None:  # held out of train, seeded (clip_benchmark's random_split)
            keep, held = held_out_split(len(train_y), options.val_proportion, options.seed)
            train_x, train_y, val_x, val_y = train_x[keep], train_y[keep], train_x[held], train_y[held]
        test_x, test_y = features["image"]
        probe_settings = ProbeSettings(lr=options.fewshot_lr, epochs=options.fewshot_epochs,
                                       batch_size=options.batch_size, fewshot_k=options.fewshot_k, seed=options.seed,
                                       device=settings.device)
        result = probe(train_x, train_y, test_x, test_y, probe_settings, val_x=val_x, val_y=val_y)
        samples = {**result.samples, "sample_index": positions}
        n_classes = max(int(train_y.max()), int(test_y.max())) + 1
        evidence = classification_evidence(samples, n_classes, resamples=settings.bootstrap, prefix="lp_",
                                           keys=sample_keys(prepared.data, positions))
        return Scored(result.metrics, len(test_y), seconds=time.perf_counter() - started, evidence=evidence)
