"""``shapes_of/<colour>``: a whole dataset source from a plugin, a family of names with its own lookup.

Each name is the bundled shapes data (clipcache's generated test and train splits) restricted to one colour, as a
zero-shot classification over the five shapes of that colour (``red circle``, ``red square``, ...). The source
claims its six names, suggests them for a typo, lists them in ``clipcache datasets``, and opens them without files.

clipcache imports this module, once per process, for the first dataset name none of its own sources claims (these
names, a typo, the listing), so it imports only clipcache's light source contract; the data (NumPy, PIL) is made in
``open``.
"""

from __future__ import annotations

from typing import Any

from clipcache.tasks.datasets.record import DatasetRecord
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource, OpenOptions

PREFIX = "shapes_of/"
COLOURS = ("red", "green", "blue", "yellow", "purple", "orange")  # the bundled shapes' colours
TASK = "zeroshot_classification"


class ShapesOfColour(DatasetSource):
    name = "shapes_of_colour"  # the entry point's name
    description = "example plugin: the bundled shapes of one colour, its 5 shapes as classes (no files)"
    priority = 80  # after clipcache's own sources: a name they know keeps its meaning

    def claims(self, ref: DatasetRef) -> bool:
        return ref.dataset_root is None and ref.name in self.known_names()

    def task(self, ref: DatasetRef) -> str:
        return TASK

    def known_names(self) -> list[str]:
        return [PREFIX + colour for colour in COLOURS]

    def records(self) -> list[DatasetRecord]:
        return [DatasetRecord(name, TASK, (self.name,), (self.description,), splits=("train", "test"))
                for name in self.known_names()]

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> Any:
        from clipcache_plugin_example.colour_data import load_shapes_of

        return load_shapes_of(ref.name, split, limit)
