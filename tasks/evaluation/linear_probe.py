"""Linear probe: a logistic-regression layer trained on cached image features of the train split, tested on the test
split (clip_benchmark's definition; tasks/score/linear_probe.py).

It reads the same cache entries as zero-shot classification: the test split's image entry is the one
``zeroshot_classification`` wrote, and the train (and val) split entries are image entries like any other. So a probe
after a zero-shot run encodes only the train split, and a second probe with other settings encodes nothing.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from clipcache.tasks.evaluation.base import (
    DataSource,
    Encoded,
    EncodeSettings,
    EvalTask,
    Prepared,
    PromptSettings,
    Scored,
    ScoreSettings,
)
from clipcache.tasks.evaluation.common import encode_split_images, open_single_label

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.progress import StageProgress


class LinearProbe(EvalTask):
    name = "linear_probe"
    short = "linear probe"
    description = "lp_acc1, lp_acc5, lp_mean_per_class_recall of a linear layer trained on cached train features"
    needs = ("image",)
    reads = ("classification",)
    option_defaults = {"train_split": "train", "val_split": None, "val_proportion": None, "fewshot_k": -1,
                       "fewshot_lr": 0.1, "fewshot_epochs": 10, "seed": 0, "batch_size": 64}  # batches shape training
    main_metrics = (("lp_acc", 1, "lp_acc1", 1),)

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared:
        test = open_single_label(self.name, source, progress)
        return Prepared(test, len(test), source)

    def encode(self, session: Any, prepared: Prepared, store: EmbeddingStore, memo: FileHashMemo,
               settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        started = time.perf_counter()
        splits = {"image": prepared.data}
        for role, split in (("train", settings.train_split), ("val", settings.val_split)):
            if split is not None:
                splits[role] = open_single_label(self.name, replace(prepared.source, split=split), progress)
        outcomes = {role: encode_split_images(session, dataset, store, memo, settings, progress,
                                              prepared.source.limit, (sharded or {}).get(role))
                    for role, dataset in splits.items()}
        return Encoded(outcomes, seconds=time.perf_counter() - started)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared, settings: ScoreSettings) -> Scored:
        import torch

        from clipcache.tasks.score.linear_probe import ProbeSettings, held_out_split, linear_probe
        from clipcache.tasks.score.stage import check_images

        started = time.perf_counter()
        features = {}
        for role, outcome in encoded.outcomes.items():
            entry = store.open(outcome.ref.key)
            if role == "image":
                check_images(entry, prepared.n_samples)
            features[role] = (torch.from_numpy(entry.embeddings()), torch.from_numpy(entry.array("target")).long())
        train_x, train_y = features["train"]
        val_x, val_y = features.get("val", (None, None))
        if settings.val_proportion is not None:  # held out of train, seeded (clip_benchmark's random_split)
            keep, held = held_out_split(len(train_y), settings.val_proportion, settings.seed)
            train_x, train_y, val_x, val_y = train_x[keep], train_y[keep], train_x[held], train_y[held]
        test_x, test_y = features["image"]
        probe = ProbeSettings(lr=settings.fewshot_lr, epochs=settings.fewshot_epochs, batch_size=settings.batch_size,
                              fewshot_k=settings.fewshot_k, seed=settings.seed, device=settings.device)
        metrics, _ = linear_probe(train_x, train_y, test_x, test_y, probe, val_x, val_y)
        return Scored(metrics, len(test_y), seconds=time.perf_counter() - started)
