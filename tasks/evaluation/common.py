"""Pieces the image-text tasks share: opening a dataset for a task, and its prompts in a language."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, SupportsInt, TypeVar

from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.storage.experiment import LINK_UNIT
from clipcache.tasks.contract import (
    DataSource,
    Encoded,
    EncodeSession,
    EncodeSettings,
    Prepared,
    PromptSettings,
    SampleUnit,
)

if TYPE_CHECKING:  # the tasks' Options are read when parameters are validated: no numpy or rich here
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset
    from clipcache.tasks.encode.stage import EncodeOutcome
    from clipcache.tasks.progress import StageProgress

# Sample rows several tasks write (EvalTask.samples): a classified image's columns (tasks/score/classification.py:
# sample_outcomes), and a ranked query's and its judged documents' (tasks/score/retrieval_evidence.py)
CLASSIFIED_IMAGE = ("target", "prediction", "top", "correct1", "correct5", "score", "rank", "tied", "margin")
RANKED_QUERY = SampleUnit("query", ("target", "rank", "score", "top", "hits_at", "correct1", "correct5"),
                          "an evaluated query (sample_key: its id): target, rank, score its first relevant document, "
                          "top the 3 best documents by position in the corpus, hits_at the ks with a relevant "
                          "document within k")
RELEVANT_DOC = SampleUnit("relevant_doc", ("target", "rank", "score", "value"),
                          "a judged relevant document of a query (sample_index, sample_key: the query's): target the "
                          "document, its rank and score, value its gain; in rank order within the query")
# Text and any-to-any retrieval recompute every metric from these rows (tests/test_evidence_retrieval.py)
RECOMPUTING_QUERY = replace(RANKED_QUERY, recomputes="`mrr@k`, as from the `relevant_doc` rows")
RECOMPUTING_DOC = replace(RELEVANT_DOC, recomputes="every `ndcg@k`, `map@k`, `recall@k`, `precision@k`, `mrr@k` "
                                                   "(`tasks/score/text_retrieval.py: per_query_metrics`)")
METADATA_LINK = SampleUnit(LINK_UNIT, (), "one row naming the per-sample metadata the group metrics were computed "
                                          "over (sample_key: its dataset id; storage/sample_metadata.py)")

ImageTextT = TypeVar("ImageTextT", bound="EvalDataset")  # an image-text dataset (a SelectionDataset, ...)

KIND = {"zeroshot_classification": "a classification", "zeroshot_retrieval": "an image-text retrieval",
        "image_caption_selection": "an image-caption selection"}


def open_for(task: str, source: DataSource, progress: StageProgress) -> EvalDataset:
    """Index ``source`` and check it is the kind of dataset ``task`` evaluates."""
    dataset = source.open(progress)
    if dataset.task != task:
        raise DatasetError(f"task {task!r} does not fit dataset {source.name!r}: it is {KIND.get(dataset.task, 'a')} "
                           f"dataset (use --task {dataset.task} or --task auto)")
    return dataset


def open_single_label(task: str, source: DataSource, progress: StageProgress) -> EvalDataset:
    """A classification dataset with one class per image (what a probe or a clustering learns or scores against)."""
    dataset = open_for("zeroshot_classification", source, progress)
    if dataset.labels is None or dataset.labels.ndim != 1:
        raise DatasetError(f"dataset {source.name!r}: {task} needs one class per image (it is multilabel)")
    return dataset


class ImagesWithTexts(Protocol):
    """A task's data with one set of images and texts of its own (composed retrieval, multiple choice, WinoGAViL)."""

    @property
    def name(self) -> str: ...

    @property
    def split(self) -> str: ...

    @property
    def images(self) -> EvalDataset: ...


def encode_split_images(session: EncodeSession, dataset: EvalDataset, store: EmbeddingStore, memo: FileHashMemo,
                        settings: EncodeSettings, progress: StageProgress, *, limit: int | None,
                        sharded: EncodeOutcome | None = None, raw: bool = False) -> EncodeOutcome:
    """The image entry of ``dataset`` (one split): from ``sharded`` workers, the cache, or encoded now; with
    ``cached_only`` a missing entry is a CacheMissError. Every task that reads images shares these entries; ``raw``:
    one encoded now keeps the raw rows too (an entry another task wrote keeps what it has)."""
    from clipcache.tasks.encode.stage import check_cached, encode_images, image_key_fields

    fields = image_key_fields(session, dataset.image_identity(memo), dataset.split, limit)
    memo.save()
    if settings.cached_only:
        check_cached(store, [(fields, f"image embeddings of {dataset.name} ({dataset.split} split)")])
    return sharded or encode_images(session, dataset, store, fields, settings, progress, raw=raw)


def sample_keys(dataset: EvalDataset, positions: Iterable[SupportsInt]) -> list[str] | None:
    """The own names (files, shard keys) of the samples at ``positions``, for their per-sample rows; None when the
    dataset has none."""
    keys = [dataset.sample_key(int(p)) for p in positions]
    named = [k for k in keys if k is not None]
    return named if len(named) == len(keys) else None


def check_language(dataset: EvalDataset, language: str) -> None:
    if language not in dataset.languages:
        raise ConfigError(f"language: {language!r} is not available for dataset {dataset.name!r} (available: "
                          f"{', '.join(dataset.languages)})")


def class_prompts(dataset: EvalDataset, settings: PromptSettings) -> tuple[ClassPrompts, bool]:
    """The dataset's class names and templates in ``settings.language``, with the overriding files applied; and
    whether the result is still the dataset's own (a what-if otherwise)."""
    from clipcache.tasks.datasets.clip_benchmark.languages import localize

    if dataset.prompts is None:
        raise DatasetError(f"dataset {dataset.name!r} has no class names and templates to classify with")
    own = localize(dataset.prompts, dataset.name, settings.language)
    if not (settings.classnames or settings.templates):
        return own, True
    chosen = own.override(settings.classnames, settings.templates, dataset.name)
    return chosen, chosen.sha256 == own.sha256


def encode_images_and_captions(session: EncodeSession, prepared: Prepared[ImageTextT], store: EmbeddingStore,
                               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
                               sharded: dict[str, Any] | None = None) -> Encoded:
    """The image and caption entries of an image-text dataset (zero-shot retrieval, image-caption selection): from
    ``sharded`` workers, the cache, or encoded now; with ``cached_only`` every missing one is named at once."""
    import time

    from clipcache.tasks.encode.stage import (
        caption_key_fields,
        check_cached,
        encode_captions,
        encode_images,
        image_key_fields,
    )

    started = time.perf_counter()
    dataset, sharded = prepared.data, sharded or {}
    identity = dataset.identity(memo)
    image_fields = image_key_fields(session, dataset.image_identity(memo), dataset.split, prepared.source.limit)
    memo.save()
    caption_fields = caption_key_fields(session, identity, dataset.split, prepared.source.limit)
    if settings.cached_only:
        check_cached(store, [(image_fields, f"image embeddings of {dataset.name}"),
                             (caption_fields, f"caption embeddings of {dataset.name}")])
    images = sharded.get("image") or encode_images(session, dataset, store, image_fields, settings, progress)
    captions = sharded.get("caption") or encode_captions(session, dataset, store, caption_fields, settings, progress)
    return Encoded({"image": images, "caption": captions}, seconds=time.perf_counter() - started)


def encode_images_and_texts(session: EncodeSession, data: ImagesWithTexts, store: EmbeddingStore,
                            memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
                            limit: int | None, fmt: str, image_role: str, image_what: str,
                            texts: dict[str, tuple[list[str], str, str]]) -> Encoded:
    """The entries of a task with one set of images (``data.images``) and texts keyed by their content alone.

    The images are keyed as every task's images are, under ``image_role``. ``texts`` maps each text role to (its
    texts, the encode stage's word for one of them, what the cache-miss line calls them). A text entry's key holds
    the texts, not the dataset, so a corrected answer or a new image re-encodes no text. With ``cached_only``, one
    CacheMissError lists every missing entry. Both tasks that use it hand raw features on: new entries keep the raw
    rows (the model's output, bit for bit) beside the normalised ones."""
    import time

    from clipcache.storage.hashing import digest
    from clipcache.tasks.encode.stage import check_cached, encode_images, encode_texts, image_key_fields

    started = time.perf_counter()
    image_fields = {**image_key_fields(session, data.images.identity(memo), data.split, limit), "role": image_role}
    memo.save()
    text_fields = {role: {"role": role, "model": session.resolved.identity, "precision": session.precision,
                          "dataset": {"format": fmt, "texts": digest(values)}, "split": data.split, "limit": limit}
                   for role, (values, _, _) in texts.items()}
    if settings.cached_only:
        check_cached(store, [(image_fields, f"{image_what} embeddings of {data.name}"),
                             *((text_fields[role], f"{what} embeddings of {data.name}")
                               for role, (_, _, what) in texts.items())])
    outcomes = {image_role: encode_images(session, data.images, store, image_fields, settings, progress, raw=True)}
    for role, (values, kind, _) in texts.items():
        outcomes[role] = encode_texts(session, values, store, text_fields[role], kind=kind,
                                      batch_size=settings.batch_size, progress=progress, label=data.name,
                                      meta={"dataset": data.name, "split": data.split}, raw=True)
    return Encoded(outcomes, seconds=time.perf_counter() - started)


def probe_inputs(store: EmbeddingStore, encoded: Encoded, n_samples: int, task: str,
                 features: str) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """What a probe reads from its entries: each role's vectors (``features``: ``raw`` for the normalised rows x
    their stored norms, what mteb's CLIP-style wrappers give; ``normalized`` for the rows as cached), each role's
    targets as stored, and the test images' positions (the ``image`` entry, checked against ``n_samples``)."""
    import numpy as np

    from clipcache.tasks.score.stage import check_images

    vectors, targets, positions = {}, {}, None
    for role, outcome in encoded.outcomes.items():
        entry = store.open(outcome.ref.key)
        if role == "image":
            check_images(entry, n_samples)
            positions = np.asarray(entry.array("position"), np.int64)
        vectors[role] = entry.raw_embeddings(task) if features == "raw" else entry.embeddings()
        targets[role] = np.asarray(entry.array("target"))
    return vectors, targets, positions


def dataset_root(source: DataSource, task: str, what: str) -> Path:
    """``--dataset_root`` for ``source`` (its ``{dataset}`` templates filled in), for a task that reads only local
    files; without one, one line saying what the task reads there (``what``)."""
    from clipcache.tasks.datasets import format_root

    if not source.root:
        raise DatasetError(f"{task} needs --dataset_root: {what}")
    return format_root(source.root, source.name)
