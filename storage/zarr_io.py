"""The two Zarr calls the cache makes, typed: open an entry's group, get one of its arrays."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zarr

from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.paths import AnyPath, url

if TYPE_CHECKING:
    from zarr.core.common import AccessModeLiteral


def open_group(path: AnyPath, mode: AccessModeLiteral) -> zarr.Group:
    return zarr.open_group(url(path), mode=mode, zarr_format=3)


def member(group: zarr.Group, name: str) -> zarr.Array:
    """Array ``name`` of ``group`` (a missing one, or a group in its place, is a damaged entry)."""
    found = group.get(name)
    if not isinstance(found, zarr.Array):
        raise CacheIntegrityError(f"cache entry at {group.store_path} has no array {name!r}")
    return found
