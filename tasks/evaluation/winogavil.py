"""WinoGAViL (``misc/winogavil``, DataComp's one task outside webdataset and retrieval): for each game, the
candidates closest to the cue are chosen, as many as it has associations, and the game scores the Jaccard index of
the chosen and true sets. The rule, DataComp's exactly, is in tasks/score/winogavil.py; the layout (DataComp's
Hugging Face cache) in tasks/datasets/datacomp/winogavil.py.

Two cache entries, each holding what it encodes once: the distinct candidate images (``candidate_image``) and the
distinct cue prompts (``cue_text``, DataComp's "A <cue>" / "An <cue>"); a rescore reads the games and the cache only.
Each game is a sample row (unit ``game``): its Jaccard index in ``value``, its number of candidates in ``target``;
each metric is the mean of ``value`` over its group's games (see tasks/score/winogavil.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.datacomp.winogavil import WinogavilData
    from clipcache.tasks.progress import StageProgress

IMAGE, CUE = "candidate_image", "cue_text"


class Winogavil(EvalTask["WinogavilData"]):
    name = "winogavil"
    short = "winogavil"
    description = ("jaccard: the k candidates closest to the cue (k = its associations) against the associations "
                   "(DataComp's WinoGAViL)")
    needs = (IMAGE, CUE)
    main_metrics = (("jaccard_score_10-12", None, "winogavil_jaccard_10_12", 1),)
    metrics = (
        # WinoGAViL (tasks/score/winogavil.py), named as DataComp writes them
        MetricInfo("avg_jaccard_score", True, False, "winogavil: mean over games of the Jaccard index of the k "
                                                     "candidates closest to the cue (k = its associations) and the "
                                                     "associations"),
        *[MetricInfo(f"jaccard_score_{g}", True, False, f"winogavil: the mean Jaccard index over the games with {what}")
          for g, what in (("5", "5 candidates"), ("6", "6 candidates"), ("10", "10 candidates"),
                          ("12", "12 candidates"), ("5-6", "at most 6 candidates"),
                          ("10-12", "at least 10 candidates (DataComp's main metric)"))],
    )
    samples = (SampleUnit("game", ("value", "target", "prediction", "top", "tied", "margin", "score"),
                          "a game: its Jaccard index in value, its number of candidates in target, the right picks "
                          "in prediction, the picks in top, the k-th score, its margin and tie"),)

    def serves(self, role: str, kind: str) -> bool:
        return role in self.needs  # no other task writes these roles

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[WinogavilData]:
        from clipcache.tasks.datasets.datacomp.winogavil import open_winogavil
        from clipcache.tasks.evaluation.common import dataset_root

        root = dataset_root(source, self.name, "DataComp's data root (its hf_cache folder holds "
                            "nlphuji___winogavil/.../winogavil-test.arrow)")
        data = open_winogavil(source.name, root, source.split, source.limit)
        return Prepared(data, len(data.truth), source)

    def encode(self, session: EncodeSession, prepared: Prepared[WinogavilData], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.evaluation.common import encode_images_and_texts

        data = prepared.data  # new games over the same cues re-encode no text
        return encode_images_and_texts(session, data, store, memo, settings, progress, limit=prepared.source.limit,
                                       fmt="winogavil", image_role=IMAGE, image_what="candidate image",
                                       texts={CUE: (data.cues, "cue", "cue")})

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[WinogavilData],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.score.cached_rows import image_rows, text_vectors
        from clipcache.tasks.score.winogavil import GROUPS, game_evidence, game_outcomes, in_group, winogavil_metrics

        started = time.perf_counter()
        data = prepared.data
        entry = store.open(encoded.outcomes[IMAGE].ref.key)
        rows = image_rows(entry, len(data.images))
        # a game with an undecodable candidate is not played (its k and its Jaccard index would change)
        kept = np.flatnonzero([bool((rows[g] >= 0).all()) for g in data.game_images])
        if not len(kept):
            raise DatasetError(f"dataset {data.name!r}: no game is left with every candidate image decodable")
        images = entry.embeddings()
        cues = text_vectors(store.open(encoded.outcomes[CUE].ref.key), len(data.cues))
        outcomes = game_outcomes(cues[data.game_cue[kept]], [images[rows[data.game_images[g]]] for g in kept],
                                 [data.truth[g] for g in kept])
        metrics = winogavil_metrics(outcomes["value"], outcomes["target"])
        skipped = len(data.images) - entry.count
        if skipped:
            metrics["skipped_images"] = float(skipped)
        keys = [data.keys[g] for g in kept] if data.keys else None
        evidence = game_evidence(outcomes, kept, resamples=settings.bootstrap, keys=keys)
        tied = {m: int((outcomes["tied"] & in_group(outcomes["target"], m)).sum()) for m in GROUPS}
        return Scored(metrics, len(kept), tied, time.perf_counter() - started, evidence=evidence)
