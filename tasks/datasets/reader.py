"""What a dataset reader is, for readers that other packages add (entry point group ``clipcache.datasets``).

A reader turns (name, root folder, split, limit) into an indexed :class:`EvalDataset`. Readers are registered by
name in ``DATASETS`` (the built-in ones in tasks/datasets/loaders.py, plugins' through the entry point group); a
:class:`DatasetReader` carries its task itself, so ``--task auto`` knows it before indexing anything::

    # my_pkg/reader.py                         # pyproject.toml
    class CsvCaptions(DatasetReader):          # [project.entry-points."clipcache.datasets"]
        task = "zeroshot_retrieval"            # csv_captions = "my_pkg.reader:CsvCaptions"
        def read(self, name, root, split, limit): ...

See docs/plugins.md and examples/clipcache-plugin-example.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import DATASET_TASKS, EvalDataset, Task


class DatasetReader(ABC):
    """A dataset layout: ``read`` indexes it (no image decoded) and returns an EvalDataset of ``task``."""

    task: ClassVar[Task]
    description: ClassVar[str] = ""

    @abstractmethod
    def read(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        """Index the dataset under ``root`` (None when no --dataset_root / data_dir was given): exactly the first
        ``limit`` samples when ``limit`` is set. Bad files raise DatasetError naming the file and line."""

    def __call__(self, name: str, root: Path | None, split: str, limit: int | None) -> EvalDataset:
        dataset = self.read(name, root, split, limit)
        if not isinstance(dataset, EvalDataset):
            raise DatasetError(f"dataset reader {type(self).__name__} returned {type(dataset).__name__}, not an "
                               f"EvalDataset")
        return dataset


def as_reader(name: str, obj: Any, origin: str) -> Any:
    """A registry entry as a callable reader: a DatasetReader class is instantiated; anything else must be callable
    (a function with a ``task`` attribute) or it is a DatasetError naming the entry point."""
    if isinstance(obj, type) and issubclass(obj, DatasetReader):
        obj = obj()
    if isinstance(obj, DatasetReader) and getattr(obj, "task", None) not in DATASET_TASKS:
        raise DatasetError(f"dataset {name!r} ({origin}): its reader must declare task = one of "
                           f"{', '.join(DATASET_TASKS)}")
    if not callable(obj):
        raise DatasetError(f"dataset {name!r} ({origin}) is not a dataset reader (got {type(obj).__name__}); an "
                           f"entry point in clipcache.datasets must name a DatasetReader instance or subclass")
    return obj
