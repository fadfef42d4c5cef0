"""Pieces the image-text tasks share: opening a dataset for a task, and its prompts in a language."""

from __future__ import annotations

from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset
from clipcache.tasks.evaluation.base import DataSource, PromptSettings
from clipcache.tasks.progress import StageProgress

KIND = {"zeroshot_classification": "a classification", "zeroshot_retrieval": "an image-text retrieval"}


def open_for(task: str, source: DataSource, progress: StageProgress) -> EvalDataset:
    """Index ``source`` and check it is the kind of dataset ``task`` evaluates."""
    dataset = source.open(progress)
    if dataset.task != task:
        raise DatasetError(f"task {task!r} does not fit dataset {source.name!r}: it is {KIND.get(dataset.task, 'a')} "
                           f"dataset (use --task {dataset.task} or --task auto)")
    return dataset


def check_language(dataset: EvalDataset, language: str) -> None:
    if language not in dataset.languages:
        raise ConfigError(f"language: {language!r} is not available for dataset {dataset.name!r} (available: "
                          f"{', '.join(dataset.languages)})")


def class_prompts(dataset: EvalDataset, settings: PromptSettings) -> tuple[ClassPrompts, bool]:
    """The dataset's class names and templates in ``settings.language``, with the overriding files applied; and
    whether the result is still the dataset's own (a what-if otherwise)."""
    from clipcache.tasks.datasets.languages import localize

    own = localize(dataset.prompts, dataset.name, settings.language)
    if not (settings.classnames or settings.templates):
        return own, True
    chosen = own.override(settings.classnames, settings.templates, dataset.name)
    return chosen, chosen.sha256 == own.sha256
