"""MIEB's multilabel image classification (mteb 2.x's VOC2007 protocol: a k-nearest-neighbour classifier per class
on few-shot train features, 5 experiments, label-ranking average precision) over cached image features; the
protocol in tasks/score/multilabel_probe.py, the layouts (VOC 2007 as distributed, or users' label lists) in
tasks/datasets/mieb/multilabel_layouts.py.

It reads the image entries of the test split (role ``image``) and of ``train_split`` (role ``train``), the entries
every task reading that folder's splits shares. ``probe_features: raw`` (the default) fits on normalised row x
stored norm, the raw features mteb's CLIP, OpenCLIP and SigLIP wrappers hand its evaluator; ``normalized`` on the
rows as cached. Each test image of each experiment is a sample row (unit ``image_experiment_<i>``: ``top`` the
predicted classes, ``correct1`` whether they are exactly the true ones, ``value`` the image's hamming score), from
which each experiment's ``accuracy`` and ``hamming`` recompute.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, PositiveInt

from clipcache.storage.errors import DatasetError
from clipcache.tasks.contract import SampleUnit, TaskOptions
from clipcache.tasks.evaluation.base import (
    DataSource,
    Encoded,
    EncodeSettings,
    Prepared,
    Scored,
    ScoreSettings,
)
from clipcache.tasks.evaluation.common import sample_keys
from clipcache.tasks.evaluation.linear_probe import LinearProbe
from clipcache.tasks.evaluation.mieb_linear_probe import MiebLinearProbe
from clipcache.tasks.evaluation.probes import ProbeTask, experiment_metrics

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.datasets.base import EvalDataset
    from clipcache.tasks.progress import StageProgress

# shared with the other probes: one default and help each
_TRAIN_SPLIT = LinearProbe.Options.model_fields["train_split"]
_N_EXPERIMENTS = MiebLinearProbe.Options.model_fields["n_experiments"]
_SEED = MiebLinearProbe.Options.model_fields["probe_seed"]
_FEATURES = MiebLinearProbe.Options.model_fields["probe_features"]
UNIT = "image_experiment_{}"


def open_multilabel_split(task: str, source: DataSource, progress: StageProgress) -> EvalDataset:
    """A multilabel split: the folder's own layout (VOCdevkit/VOC2007, label lists) when ``--dataset_root`` holds
    one, else whatever dataset the name opens (a webdataset with ``dataset_type.txt`` multilabel), which must be
    multilabel."""
    from clipcache.tasks.datasets import format_root
    from clipcache.tasks.datasets.mieb.multilabel_layouts import multilabel_root, open_multilabel

    root = format_root(source.root, source.name) if source.root else None
    if root is not None and multilabel_root(root) is not None:
        return open_multilabel(source.name, root, source.split, source.limit)
    dataset = source.open(progress)
    if dataset.labels is None or dataset.labels.ndim != 2:
        raise DatasetError(f"dataset {source.name!r}: {task} needs multilabel data (a multi-hot row of classes per "
                           f"image: VOCdevkit/VOC2007, multilabel_<split>.jsonl, or a multilabel webdataset)")
    return dataset


class MultilabelProbe(ProbeTask):
    name = "multilabel_probe"
    short = "multilabel probe"
    description = ("multilabel_lrap, multilabel_accuracy, multilabel_f1, multilabel_hamming (mean and _std over "
                   "experiments): MIEB's VOC2007 kNN probe on few-shot train features")
    main_metrics = (("multilabel_lrap", None, "multilabel_lrap", 1),)
    metrics = (
        # multilabel_probe (tasks/score/multilabel_probe.py): mteb's multilabel scores (VOC2007), mean and spread
        *experiment_metrics("multilabel_probe", "multilabel", (
            ("lrap", "label-ranking average precision of the predicted label sets (MIEB's main score)"),
            ("accuracy", "subset accuracy (predicted label set exactly the true one)"),
            ("f1", "macro F1 over the classes"),
            ("hamming", "mean per image of |true & predicted| / |true | predicted| (mteb's hamming)")),
            "a kNN fitted on few-shot train features"),
    )
    samples = (SampleUnit("image_experiment_<i>", ("top", "correct1", "value"), "a test image in experiment i: the "
                                                                                  "predicted classes, whether all "
                                                                                  "are right, its Hamming loss"),)

    class Options(TaskOptions):
        """mteb's multilabel classification settings, with VOC2007's values."""

        encode_fields: ClassVar[tuple[str, ...]] = ("train_split",)

        train_split: str = Field(_TRAIN_SPLIT.default, description=_TRAIN_SPLIT.description)
        multilabel_samples_per_label: PositiveInt = Field(
            8, description="train images kept per label in each experiment (mteb's samples_per_label for VOC2007)")
        multilabel_knn_k: PositiveInt = Field(5, description="neighbours of mteb's KNeighborsClassifier "
                                                             "(n_neighbors)")
        n_experiments: PositiveInt = Field(_N_EXPERIMENTS.default, description=_N_EXPERIMENTS.description)
        probe_seed: int = Field(_SEED.default, description=_SEED.description)
        probe_features: Literal["raw", "normalized"] = Field(_FEATURES.default, description=_FEATURES.description)

    def open_split(self, source: DataSource, progress: StageProgress) -> EvalDataset:
        return open_multilabel_split(self.name, source, progress)

    def learn_splits(self, settings: EncodeSettings) -> dict[str, str]:
        return {"train": self.Options.of(settings).train_split}

    def check_splits(self, prepared: Prepared[EvalDataset], splits: dict[str, EvalDataset]) -> None:
        train, test, source = splits["train"], prepared.data, prepared.source
        if train.labels is not None and test.labels is not None and train.labels.shape[1] != test.labels.shape[1]:
            raise DatasetError(f"dataset {source.name!r}: the {train.split} split has {train.labels.shape[1]} "
                               f"classes, the {source.split} split {test.labels.shape[1]}")

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[EvalDataset],
              settings: ScoreSettings) -> Scored:

        from clipcache.storage.arrow_columns import Ragged
        from clipcache.tasks.evaluation.common import probe_inputs
        from clipcache.tasks.score.evidence import Evidence
        from clipcache.tasks.score.multilabel_probe import multilabel_probe

        started = time.perf_counter()
        options = self.Options.of(settings)
        features, labels, positions = probe_inputs(store, encoded, prepared.n_samples, self.name,
                                                   options.probe_features)
        for role, values in labels.items():
            if values.ndim != 2:
                raise DatasetError(f"{self.name}: the {role} entry holds one class per image, not multi-hot rows")
        result = multilabel_probe(features["train"], labels["train"], features["image"], labels["image"],
                                  samples_per_label=options.multilabel_samples_per_label,
                                  n_experiments=options.n_experiments, seed=options.probe_seed,
                                  k=options.multilabel_knn_k)
        truth = labels["image"][:, result.classes].astype(bool)
        keys = sample_keys(prepared.data, positions)
        parts = []
        for i, predicted in enumerate(result.predictions):
            columns: dict[str, Any] = {"sample_index": positions, "top": Ragged.from_mask(predicted, result.classes),
                                       "correct1": (predicted.astype(bool) == truth).all(axis=1),
                                       "value": result.hamming_rows[i]}
            parts.append(Evidence(UNIT.format(i), columns, keys))
        evidence = replace(parts[0], more=parts[1:])
        return Scored(result.metrics, len(positions), seconds=time.perf_counter() - started, evidence=evidence)
