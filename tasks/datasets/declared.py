"""The built-in dataset sources, each declared once: the class that implements it and what it may claim, known
without importing that class's module (which may import NumPy, PIL or Arrow).

``SOURCES`` (tasks/datasets/__init__.py) is registered from this table, the name check (``check_name``) reads it to
leave out the sources that cannot claim a name, and each source reads its own declaration (``DatasetSource.declared``)
for the names it suggests and lists: one statement of each fact. A source declares either

- ``folder_only``: it claims only a folder given with --dataset_root (a BEIR folder, a ViDoRe folder, ...), never a
  bare name; or
- ``names``: it claims exactly these names (a light function: DataComp's names come from group_layouts.json, read
  once by tasks/datasets/datacomp/__init__.py); or
- neither: its ``claims`` is asked (its module is light: the registered readers, clip_benchmark's tables, mieb:).

A plugin's source (entry point group ``clipcache.dataset_sources``) has no declaration here: its ``claims`` is
asked, so its module must import as lightly as a name check needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clipcache.tasks.datasets.datacomp import group_layout_names, winogavil_names

if TYPE_CHECKING:
    from clipcache.tasks.datasets.source import DatasetRef


@dataclass(frozen=True)
class Declared:
    """Where a source's class is (``module:Class``) and what it may claim."""

    target: str = ""
    folder_only: bool = False  # claims only a folder given with --dataset_root
    names: Callable[[], list[str]] | None = None  # claims exactly these names (None: not declared)

    def may_claim(self, ref: DatasetRef) -> bool:
        """Whether the source may claim ``ref``, as far as the declaration says (True: ask its ``claims``)."""
        if self.folder_only:
            return ref.dataset_root is not None
        if self.names is not None:
            names = self.names()
            return ref.name in names or ref.bare in names
        return True

    def known_names(self) -> list[str]:
        return list(self.names()) if self.names is not None else []


UNDECLARED = Declared()
_D = "clipcache.tasks.datasets"

# Registration order; the lookups ask them by each class's priority (tasks/datasets/sources.py has the table).
BUILTIN_SOURCES: dict[str, Declared] = {
    "beir": Declared(f"{_D}.sources:BeirFolders", folder_only=True),
    "any2any": Declared(f"{_D}.sources:Any2AnyFolders", folder_only=True),
    "registered": Declared(f"{_D}.sources:RegisteredReaders"),
    "group_layouts": Declared(f"{_D}.datacomp.group_layouts:GroupLayouts", names=group_layout_names),
    "original": Declared(f"{_D}.sources:OriginalLayouts"),
    "webdataset": Declared(f"{_D}.sources:WebdatasetFolders"),
    "hosted": Declared(f"{_D}.sources:HostedCatalog"),
    "visual_sts": Declared(f"{_D}.mieb.mieb_layouts:VisualStsFolders", folder_only=True),
    "multiple_choice": Declared(f"{_D}.mieb.mieb_layouts:MultipleChoiceFolders", folder_only=True),
    "mieb": Declared(f"{_D}.mieb.mieb_tasks:MiebSource"),
    "composed_retrieval": Declared(f"{_D}.mieb.composed_layouts:ComposedFolders", folder_only=True),
    "multilabel": Declared(f"{_D}.mieb.multilabel_layouts:MultilabelFolders", folder_only=True),
    "vidore": Declared(f"{_D}.mieb.vidore:VidoreFolders", folder_only=True),
    "winogavil": Declared(f"{_D}.datacomp.winogavil:WinogavilSource", names=winogavil_names),  # misc/winogavil
}


def declared(source: str) -> Declared:
    """The declaration of built-in source ``source`` (a plugin's: none, its claims are asked)."""
    return BUILTIN_SOURCES.get(source, UNDECLARED)
