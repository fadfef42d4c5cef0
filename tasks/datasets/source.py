"""What a dataset source is: one way of finding data for a (name, --dataset_root) pair, and how the lookups use it.

Every place a dataset can come from (a registered reader, clip_benchmark's original layouts, a local webdataset
folder, the hosted catalog, a BEIR or any-to-any folder) is a :class:`DatasetSource` in ``SOURCES``
(``clipcache.tasks.datasets``). ``check_name``, ``default_task`` and ``open_dataset`` ask the sources in ``priority``
order and use the first that ``claims`` the pair: the same rule for all three, so they cannot disagree. ``claims``
must be cheap (a name test or a few ``stat`` calls; no torch, numpy or zarr): names are checked before any work.
``records`` says what a source claims, one typed record per name (tasks/datasets/record.py): the catalog
(``dataset_catalog``) and ``clipcache datasets`` are made from them, so a new source is one declaration (a built-in
one in tasks/datasets/declared.py, another package's an entry point in ``clipcache.dataset_sources``) and is
resolved, suggested and listed alike.
This is the ``ModelLoader`` pattern of tasks/models/loader.py applied to datasets.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.tasks.datasets.declared import Declared, declared
from clipcache.tasks.datasets.record import DatasetRecord

WDS_PREFIX = "wds/"


def format_root(template: str, dataset: str) -> Path:
    """clip_benchmark's ``--dataset_root`` template: ``{dataset}`` and ``{dataset_cleaned}`` (``/`` -> ``-``)."""
    try:
        return Path(template.format(dataset=dataset, dataset_cleaned=dataset.replace("/", "-"))).expanduser()
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"dataset_root: {template!r} is not a valid template "
                          f"(placeholders: {{dataset}}, {{dataset_cleaned}})") from e


@dataclass(frozen=True)
class DatasetRef:
    """A dataset as the user names it: ``--dataset`` and ``--dataset_root`` (a folder, or a template)."""

    name: str
    dataset_root: str | None = None

    @property
    def bare(self) -> str:
        """The name without clip_benchmark's ``wds/`` prefix."""
        return self.name.removeprefix(WDS_PREFIX)

    @property
    def root(self) -> Path | None:
        """The folder the template names for this dataset (None without --dataset_root); a bad template is a
        ConfigError."""
        return format_root(self.dataset_root, self.bare) if self.dataset_root else None

    def folder(self, holding: str) -> Path:
        """The root, or a DatasetError: the dataset needs --dataset_root, the folder ``holding`` what it reads."""
        root = self.root
        if root is None:
            raise DatasetError(f"dataset {self.name!r} needs --dataset_root: the folder holding {holding}")
        return root


@dataclass(frozen=True)
class OpenOptions:
    """What ``open_dataset`` passes through to a source besides the split and the limit."""

    hub: str = "huggingface"  # where hosted datasets are downloaded from
    cache_dir: str | None = None  # ... and where to
    offline: bool = False
    progress: Any = None  # a StageProgress for downloads
    language: str = "en"  # readers whose files differ by language
    annotation_file: str | None = None  # a caption dataset's annotation file in place of its default one


class DatasetSource(ABC):
    """One place datasets come from. ``priority``: the order in which the lookups ask ``claims`` (lower first)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    priority: ClassVar[int] = 100
    # Folder formats that only these tasks read (a BEIR folder: text_retrieval). Such a source answers check_name and
    # default_task; open_dataset, which opens image datasets for the other tasks, passes it by. Empty: image data.
    only_for: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def claims(self, ref: DatasetRef) -> bool:
        """Whether this source provides ``ref`` (cheap: no data read, no heavy import, no network)."""

    @abstractmethod
    def task(self, ref: DatasetRef) -> str:
        """The task ``--task auto`` evaluates ``ref`` with, found without indexing it."""

    @abstractmethod
    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> Any:
        """Index ``ref`` (no image decoded): exactly the first ``limit`` samples when set. An EvalDataset, except for
        ``only_for`` sources, which return their task's data. DatasetError naming the file for bad data."""

    @property
    def declared(self) -> Declared:
        """What this source may claim, as tasks/datasets/declared.py states it for a built-in source (where the
        name check reads it without importing the source's module); a plugin's source declares nothing there."""
        return declared(self.name)

    def known_names(self) -> list[str]:
        """Names this source can suggest for a typo ("Did you mean"): by default its declared names."""
        return self.declared.known_names()

    def records(self) -> list[DatasetRecord]:
        """What the catalog (and ``clipcache datasets``) lists for this source: a record per known name, or, for a
        source that claims a folder format under any name, one pattern record ``<name>``. Override it to say more
        (layouts, splits, languages); it must stay as cheap as ``known_names`` (no data read)."""
        layouts = (self.description,) if self.description else ()
        if names := self.known_names():
            return [DatasetRecord(n, self.task(DatasetRef(n)), (self.name,), layouts) for n in names]
        task = self.only_for[0] if len(self.only_for) == 1 else ""
        return [DatasetRecord("<name>", task, (self.name,), layouts)]
