"""Multiple choice (MIEB's Any2AnyMultipleChoice / vision-centric QA, e.g. CV-Bench): each question is an image and
a text, its choices are texts, and the choice most similar to the fused image+question query is the answer given.
The rule, mteb's exactly (fusion, cosine, pytrec_eval's tie order), is in tasks/score/multiple_choice.py; the layout
(``questions.jsonl``) in tasks/datasets/mieb/mieb_layouts.py.

Three cache entries, each holding what it encodes once: the distinct question images (``question_image``), the
distinct question texts (``question_text``) and the distinct choice texts (``choice_text``); a rescore reads the
folder's answers and the cache only. Each question is a sample row (unit ``example``): its answer in ``target``, the
choice given in ``prediction``, ``correct1`` (acc1 is their mean), ``rank``, ``tied``, ``score``, ``margin``.

The query sums the image's and the question's raw features (normalised row x stored norm), as mteb's CLIP-style
wrappers sum theirs; entries without norms are summed normalised, with a warning
(tasks/evaluation/composed_retrieval.fusion_sides). Choices are raw features too where their entry keeps norms:
cosine does not see a norm, but normalising mteb's raw vectors gives its bits.
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
    from clipcache.tasks.datasets.mieb.mieb_layouts import MultipleChoiceData
    from clipcache.tasks.progress import StageProgress

IMAGE, QUESTION, CHOICE = "question_image", "question_text", "choice_text"


class MultipleChoice(EvalTask["MultipleChoiceData"]):
    name = "multiple_choice"
    short = "multiple_choice"
    description = "acc1: the choice closest to the image+question query is the answer (MIEB Any2AnyMultipleChoice)"
    needs = (IMAGE, QUESTION, CHOICE)
    main_metrics = (("acc", 1, "multiple_choice_acc1", 1),)
    metrics = (MetricInfo("acc", True, True, "(k = 1) fraction of questions whose answer is the best-scored choice"),)
    samples = (SampleUnit("example", ("target", "prediction", "correct1", "rank", "tied", "score", "margin"),
                          "a question: its answer, the chosen choice, whether right (acc1 is their mean), the "
                          "answer's rank, tie, score and margin"),)

    def serves(self, role: str, kind: str) -> bool:
        return role in self.needs  # no other task writes these roles

    def prepare(self, source: DataSource, prompts: PromptSettings,
                progress: StageProgress) -> Prepared[MultipleChoiceData]:
        from clipcache.tasks.datasets.mieb.mieb_layouts import open_multiple_choice
        from clipcache.tasks.evaluation.common import dataset_root

        root = dataset_root(source, self.name, "a folder with questions.jsonl (image, "
                            "question, choices, answer)")
        data = open_multiple_choice(source.name, root, source.split, source.limit)
        return Prepared(data, len(data.answers), source)

    def encode(self, session: EncodeSession, prepared: Prepared[MultipleChoiceData], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.evaluation.common import encode_images_and_texts

        data = prepared.data
        return encode_images_and_texts(session, data, store, memo, settings, progress, limit=prepared.source.limit,
                                       fmt="multiple_choice", image_role=IMAGE, image_what="question image",
                                       texts={role: (values, role.split("_")[0], role.replace("_", " "))
                                              for role, values in ((QUESTION, data.questions),
                                                                   (CHOICE, data.choices))})

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[MultipleChoiceData],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.evaluation.composed_retrieval import fusion_sides
        from clipcache.tasks.score.cached_rows import image_rows, text_vectors
        from clipcache.tasks.score.multiple_choice import choice_evidence, choice_outcomes

        started = time.perf_counter()
        data = prepared.data
        entry = store.open(encoded.outcomes[IMAGE].ref.key)
        rows = image_rows(entry, len(data.images))[data.question_image]
        kept = np.flatnonzero(rows >= 0)  # a question whose image did not decode is not asked
        if not len(kept):
            raise DatasetError(f"dataset {data.name!r}: no question is left with a decodable image")
        images, questions = fusion_sides(entry, store.open(encoded.outcomes[QUESTION].ref.key), len(data.questions),
                                         self.name, data.name)
        choice_entry = store.open(encoded.outcomes[CHOICE].ref.key)
        choices = text_vectors(choice_entry, len(data.choices))
        if choice_entry.has_norms:  # raw, as mteb's wrappers hand them: cosine normalises them as mteb does, bit for bit
            choices = choice_entry.raw_embeddings(self.name)
        answers = data.answers[kept]
        outcomes = choice_outcomes(images[rows[kept]], questions[data.question_text[kept]], choices,
                                   [data.question_choices[i] for i in kept], answers)
        metrics = {"acc1": float(outcomes["correct1"].mean())}
        skipped = len(data.images) - entry.count
        if skipped:
            metrics["skipped_images"] = float(skipped)
        keys = [data.keys[i] for i in kept] if data.keys else None
        evidence = choice_evidence(outcomes, answers, kept, resamples=settings.bootstrap, keys=keys)
        return Scored(metrics, len(kept), {"acc1": int(outcomes["tied"].sum())}, time.perf_counter() - started,
                      evidence=evidence)
