"""The probe family: tasks that read a classification dataset's cached image features and nothing else (linear
probe, MIEB's linear probe, kNN classification, the multilabel probe, image clustering).

They share ``prepare`` and ``encode``: the test split is opened as the task's data (role ``image``), and the splits a
task learns from (``train``, ``val``: :meth:`ProbeTask.learn_splits`) are opened beside it; every split's images go
through the cache as the image entry every task reading that split shares. A member declares only its options, how
it opens one split (one class per image unless it says otherwise), and its ``score``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from clipcache.tasks.contract import DataSource, Encoded, EncodeSession, EncodeSettings, Prepared, PromptSettings
from clipcache.tasks.evaluation.base import EvalTask, MetricInfo
from clipcache.tasks.evaluation.common import encode_split_images, open_single_label

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.base import EvalDataset
    from clipcache.tasks.progress import StageProgress


def experiment_metrics(task: str, prefix: str, scores: tuple[tuple[str, str], ...], fitted: str) -> tuple[MetricInfo, ...]:
    """A probe's metrics over its few-shot experiments: for each (name, what) of ``scores``, ``<prefix>_<name>`` (the
    mean over experiments of the test ``what`` of ``fitted``) and ``<prefix>_<name>_std`` (their spread)."""
    return tuple(m for name, what in scores for m in (
        MetricInfo(f"{prefix}_{name}", True, False, f"{task}: mean over experiments of the test {what} of {fitted}"),
        MetricInfo(f"{prefix}_{name}_std", False, False, f"{task}: standard deviation (ddof 0) over experiments of "
                                                         f"the test {what}")))

class ProbeTask(EvalTask["EvalDataset"]):
    """A task over the cached image features of a classification dataset's splits."""

    needs = ("image",)
    reads = ("classification",)
    # new entries keep their raw rows too (the MIEB probe reads the model's output bit for bit); an entry another
    # task wrote keeps what it has
    raw_features: ClassVar[bool] = False

    def open_split(self, source: DataSource, progress: StageProgress) -> EvalDataset:
        """One split of the dataset, checked to be what the task reads (here: one class per image)."""
        return open_single_label(self.name, source, progress)

    def learn_splits(self, settings: EncodeSettings) -> dict[str, str]:
        """The splits read beside the test split, by role (``train``, ``val``), as the task's options name them:
        none here (a task that fits nothing)."""
        return {}

    def check_splits(self, prepared: Prepared[EvalDataset], splits: dict[str, EvalDataset]) -> None:
        """Refuse splits that do not fit together (before anything is encoded): nothing to check here."""

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[EvalDataset]:
        test = self.open_split(source, progress)
        return Prepared(test, len(test), source)

    def encode(self, session: EncodeSession, prepared: Prepared[EvalDataset], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        started = time.perf_counter()
        splits = {"image": prepared.data}
        for role, split in self.learn_splits(settings).items():
            splits[role] = self.open_split(replace(prepared.source, split=split), progress)
        self.check_splits(prepared, splits)
        outcomes = {role: encode_split_images(session, dataset, store, memo, settings, progress,
                                              limit=prepared.source.limit, sharded=(sharded or {}).get(role),
                                              raw=self.raw_features)
                    for role, dataset in splits.items()}
        return Encoded(outcomes, seconds=time.perf_counter() - started)
