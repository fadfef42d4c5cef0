"""The images of a loaded ``mieb:`` task, checked before mteb decodes any of them.

``datasets`` keeps an image cell as ``{"bytes", "path"}`` and decodes it when mteb reads the row: from the bytes, or,
when a cell has none, by opening whatever ``path`` names (any file on the machine, or a URL it downloads). Data is
untrusted, so a path-only cell must name a file inside ``--dataset_root`` (resolved as ``datasets`` resolves it,
symlinks followed); anything else is refused in one line naming the row, never opened, encoded or sent to an API
model. There is no switch to allow it: copy such images into the folder, or store their bytes in the Parquet files.

Every image is also opened here as the other readers open theirs (tasks/datasets/image_bytes.py): PIL's
decompression-bomb bound (an image over ``2 x PIL.Image.MAX_IMAGE_PIXELS`` pixels is refused from its header) and
junk bytes become one line naming the row, not a traceback from inside mteb's evaluation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError


def check_mieb_images(name: str, dataset: Any, root: Path | None) -> int:
    """Check every image cell of ``dataset`` (mteb's ``task.dataset``: nested dicts of ``datasets.Dataset``);
    returns how many were checked. DatasetError on the first bad one."""
    checked = 0
    for where, table in _tables(dataset, f"mieb:{name}"):
        for column in _image_columns(table):
            for row, cell in _cells(table, column):
                _check_cell(cell, f"{where} column {column} row {row}", root)
                checked += 1
    return checked


def _tables(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    from datasets import Dataset  # type: ignore[import-untyped]

    if isinstance(node, Dataset):
        yield where, node
    elif isinstance(node, dict):  # DatasetDict is a dict; mteb nests subsets, splits, corpus / queries
        for key, value in node.items():
            yield from _tables(value, f"{where} {key}")


def _image_columns(table: Any) -> list[str]:
    from datasets import Image, Sequence

    def holds_image(feature: Any) -> bool:
        if isinstance(feature, Image):
            return True
        if isinstance(feature, Sequence):
            return holds_image(feature.feature)
        return isinstance(feature, list) and len(feature) == 1 and holds_image(feature[0])

    return [c for c, f in table.features.items() if holds_image(f)]


def _cells(table: Any, column: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row, {"bytes", "path"}) for every image of ``column``, raw (nothing decoded); lists of images flattened."""
    row = 0
    for batch in table.select_columns([column]).with_format("arrow").iter(batch_size=256):
        for value in batch.column(column).to_pylist():
            for cell in value if isinstance(value, list) else [value]:
                if isinstance(cell, dict):
                    yield row, cell
            row += 1


def _check_cell(cell: dict[str, Any], where: str, root: Path | None) -> None:
    from clipcache.tasks.datasets.image_bytes import opened_image

    data, path = cell.get("bytes"), cell.get("path")
    if data is None:
        if not path:
            return  # an empty cell: mteb's own handling
        data = _inside_root(str(path), where, root).read_bytes()
    with opened_image(data, lambda: where) as img:  # reads the header: PIL refuses a bomb here
        img.verify()


def _inside_root(path: str, where: str, root: Path | None) -> Path:
    """The file a path-only cell names, when it lies inside ``root``; else DatasetError (nothing is opened)."""
    if "://" in path or path.startswith("hf:"):
        raise DatasetError(f"{where}: the image is a URL ({path!r}), not bytes in the data; clipcache opens no "
                           f"address named inside data")
    if root is None:
        raise DatasetError(f"{where}: the image is stored by path only ({path!r}); with data from the hub, images "
                           f"must be bytes in the Parquet files")
    base = root.resolve()
    target = Path(path).resolve()  # what `datasets` would open: relative to the working folder, links followed
    if not target.is_relative_to(base):
        raise DatasetError(f"{where}: image path {path!r} lies outside --dataset_root {root} (-> {target}); images "
                           f"named inside data must be inside the dataset's folder")
    if not target.is_file():
        raise DatasetError(f"{where}: image path {path!r} is not a file")
    return target
