"""The data of ``shapes_of/<colour>`` (colour_source.py): the bundled shapes of one colour, classified by shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import ClassPrompts
from clipcache.tasks.datasets.shapes import COLOURS, SHAPES, TEMPLATES, ShapesDataset, load_shapes
from clipcache_plugin_example.colour_source import PREFIX, TASK


@dataclass
class ShapesOfColourDataset(ShapesDataset):
    colour: str = ""

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {**super().identity(memo), "format": "shapes_of", "colour": self.colour}


def load_shapes_of(name: str, split: str, limit: int | None) -> ShapesOfColourDataset:
    """The samples of the bundled ``shapes`` split whose colour the name says, in their order (the first ``limit``)."""
    colour = name.removeprefix(PREFIX)
    if colour not in COLOURS:
        raise DatasetError(f"dataset {name!r}: the bundled shapes have no colour {colour!r}")
    full = load_shapes("shapes", TASK, split, None)
    samples = [s for s in full.samples if s.colour == colour][:limit]
    ds = ShapesOfColourDataset(name=name, split=split, task=TASK, n=len(samples), samples=samples, colour=colour)
    ds.labels = np.array([SHAPES.index(s.shape) for s in samples], dtype=np.int64)
    ds.prompts = ClassPrompts([f"{colour} {shape}" for shape in SHAPES], list(TEMPLATES), "en",
                              "clipcache_plugin_example.colour_data")
    return ds
