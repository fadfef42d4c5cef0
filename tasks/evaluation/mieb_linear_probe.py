"""MIEB's linear probe (mteb 2.x ImageClassification: scikit-learn logistic regression on 16 train samples per label,
5 experiments, mean and spread) over cached image features; the protocol in tasks/score/mieb_probe.py.

It reads the image entries linear_probe and zero-shot classification read (the test split's and the train split's),
so after either it encodes nothing new. ``probe_features: raw`` (the default) probes the raw features mteb's CLIP,
OpenCLIP and SigLIP wrappers hand its evaluator: the model's output bit for bit where the entry keeps its raw rows
(entries this task encodes), else normalised row x stored norm (entries another task or an earlier release wrote,
within ~1e-7 relative); an entry written before norms were kept is refused in one line naming the command that deletes it, and ``probe_features: normalized`` probes the rows as cached.
Each test image of each experiment is a sample row (unit ``image_experiment_<i>``: target, prediction, correct1),
from which every experiment's scores, so their mean and spread, recompute.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, PositiveInt

from clipcache.tasks.contract import SampleUnit, TaskOptions
from clipcache.tasks.evaluation.base import Encoded, EncodeSettings, Prepared, Scored, ScoreSettings
from clipcache.tasks.evaluation.common import sample_keys
from clipcache.tasks.evaluation.linear_probe import LinearProbe
from clipcache.tasks.evaluation.probes import ProbeTask, experiment_metrics

_TRAIN_SPLIT = LinearProbe.Options.model_fields["train_split"]  # one default and help, shared with linear_probe

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.datasets.base import EvalDataset

UNIT = "image_experiment_{}"


class MiebLinearProbe(ProbeTask):
    name = "mieb_linear_probe"
    short = "mieb probe"
    description = ("mieb_lp_accuracy, mieb_lp_f1, ... (mean and _std over experiments): MIEB's logistic-regression "
                   "probe on few-shot train features")
    main_metrics = (("mieb_lp_accuracy", None, "mieb_lp_accuracy", 1),)
    raw_features = True
    metrics = (
        # tasks/score/mieb_probe.py: mteb's ImageClassification scores, mean and spread over experiments
        *experiment_metrics("mieb_linear_probe", "mieb_lp", (
            ("accuracy", "accuracy"), ("f1", "macro F1"), ("f1_weighted", "support-weighted F1"),
            ("precision", "macro precision"), ("precision_weighted", "support-weighted precision"),
            ("recall", "macro recall"), ("recall_weighted", "support-weighted recall"),
            ("ap", "macro average precision of the predicted labels (two classes only)"),
            ("ap_weighted", "weighted average precision of the predicted labels (two classes only)")),
            "a logistic regression fitted on few-shot train features (MIEB's linear probe)"),
    )
    samples = (SampleUnit("image_experiment_<i>", ("target", "prediction", "correct1"), "a test image in experiment "
                                                                                         "i: its class, the probe's "
                                                                                         "prediction, whether right"),)

    class Options(TaskOptions):
        """mteb's ImageClassification settings, with its defaults (the 16 / 5 of CIFAR10, DTD, Country211, ...)."""

        encode_fields: ClassVar[tuple[str, ...]] = ("train_split",)

        train_split: str = Field(_TRAIN_SPLIT.default, description=_TRAIN_SPLIT.description)  # linear_probe's
        samples_per_label: PositiveInt = Field(16, description="training samples per label in each experiment "
                                                               "(mteb's samples_per_label)")
        n_experiments: PositiveInt = Field(5, description="experiments, each on its own pick (mteb's n_experiments)")
        probe_seed: int = Field(42, description="the picks' and the classifier's seed (mteb's task seed)")
        probe_max_iter: PositiveInt = Field(100, description="LogisticRegression's max_iter (mteb's "
                                                             "evaluator_model)")
        probe_features: Literal["raw", "normalized"] = Field(
            "raw", description="raw: normalised rows x their stored norms (what mteb's CLIP-style wrappers give); "
                               "normalized: the rows as cached")

    def learn_splits(self, settings: EncodeSettings) -> dict[str, str]:
        return {"train": self.Options.of(settings).train_split}

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[EvalDataset],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.evaluation.common import probe_inputs
        from clipcache.tasks.score.evidence import Evidence
        from clipcache.tasks.score.mieb_probe import mieb_probe

        started = time.perf_counter()
        options = self.Options.of(settings)
        features, stored, positions = probe_inputs(store, encoded, prepared.n_samples, self.name,
                                                   options.probe_features)
        labels = {role: np.asarray(values, np.int64) for role, values in stored.items()}
        result = mieb_probe(features["train"], labels["train"], features["image"], labels["image"],
                            samples_per_label=options.samples_per_label, n_experiments=options.n_experiments,
                            seed=options.probe_seed, max_iter=options.probe_max_iter)
        keys = sample_keys(prepared.data, positions)
        parts = [Evidence(UNIT.format(i), {"sample_index": positions, "target": labels["image"],
                                           "prediction": predicted, "correct1": predicted == labels["image"]}, keys)
                 for i, predicted in enumerate(result.predictions)]
        evidence = replace(parts[0], more=parts[1:])
        return Scored(result.metrics, len(positions), seconds=time.perf_counter() - started, evidence=evidence)
