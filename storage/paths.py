"""Local folders and fsspec URLs behind one path type.

``cache_dir`` and ``output_dir`` may be local folders or fsspec URLs (``s3://bucket/prefix``, ``gs://…``,
``memory://…``). :func:`as_path` returns a :class:`pathlib.Path` for the first and a ``universal_pathlib`` ``UPath``
for the second; both offer the same methods (``/``, ``exists``, ``glob``, ``read_text``, ``write_text``, ``unlink``…),
so the storage code is written once. What object stores lack is handled where it matters:

- no rename: a file is published by one upload (an object appears whole or not at all), and a cache entry is
  published by writing its metadata last (see :mod:`storage.embedding_store`);
- no file locks: :func:`lock` is a no-op remotely; the sharded encoder gives each worker its own chunks instead.

Credentials and endpoints come from the filesystem's usual configuration (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``,
``GOOGLE_APPLICATION_CREDENTIALS``, fsspec config files), so a URL alone names a location on every worker.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

AnyPath = Any  # pathlib.Path or upath.UPath; both implement the methods used here


def is_url(location: str | os.PathLike) -> bool:
    text = str(location)
    return "://" in text and not text.startswith("file://")


def as_path(location: str | os.PathLike) -> AnyPath:
    """A ``Path`` for a local folder (``file://`` URLs included), a ``UPath`` for any other fsspec URL."""
    if isinstance(location, Path):
        return location
    if not is_url(location):
        text = str(location)
        return Path(text[len("file://"):] if text.startswith("file://") else text)
    from upath import UPath

    return location if isinstance(location, UPath) else UPath(str(location))


def is_remote(path: AnyPath) -> bool:
    return not isinstance(path, Path)


def url(path: AnyPath) -> str:
    """What zarr and DuckDB accept: the plain path locally, the ``protocol://…`` URL remotely."""
    return str(path)


def write_via_temp(path: AnyPath, write: Callable[[Path], None]) -> None:
    """Remote publish of a file: ``write(tmp)`` to a local temporary file, then upload it in one piece."""
    fd, tmp = tempfile.mkstemp(suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        path.fs.put_file(tmp, path.path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def lock(path: AnyPath) -> contextlib.AbstractContextManager:
    """A file lock at ``path`` locally; remotely nothing (object stores have no locks; see the module docstring)."""
    if is_remote(path):
        return _NoLock()
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path))


class _NoLock(contextlib.nullcontext):
    def acquire(self, timeout: float | None = None) -> None:
        pass

    def release(self) -> None:
        pass


def touch(path: AnyPath) -> None:
    """Set ``path``'s modification time to now, creating it (and its folder) if needed. On an object store an
    existing object's time only changes when it is written again, so the marker is re-uploaded. Best effort: a
    read-only cache still works, it just cannot record use."""
    try:
        if is_remote(path):
            path.fs.pipe_file(path.path, b"")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    except OSError:
        pass


def rmtree(path: AnyPath) -> None:
    if is_remote(path):
        if path.exists():
            path.fs.rm(path.path, recursive=True)
        return
    import shutil

    shutil.rmtree(path, ignore_errors=False)


def tree_bytes(path: AnyPath) -> int:
    if is_remote(path):
        return int(path.fs.du(path.path, total=True)) if path.exists() else 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def local_dir(location: str | os.PathLike) -> Path:
    """A local folder for things that must be on local disk (downloaded datasets, file-hash memo): ``location``
    itself when it is local, else ``$CLIPCACHE_LOCAL_DIR`` or ``~/.cache/clipcache``."""
    path = as_path(location)
    if not is_remote(path):
        return path
    return Path(os.environ.get("CLIPCACHE_LOCAL_DIR") or Path.home() / ".cache" / "clipcache")


def _unreachable(field: str, path: AnyPath, error: Exception) -> Exception:
    """The one line for a store that did not answer a location check (the first line of the client's error), or
    that refused the credentials (storage/store_answers.py: which to check; their values are never printed)."""
    from clipcache.storage.errors import ConfigError
    from clipcache.storage.store_answers import denied

    if (refused := denied(error)) is not None:
        return ConfigError(f"{field}: {url(path)} {refused}")
    return ConfigError(f"{field}: cannot reach {url(path)} ({type(error).__name__}: "
                       f"{(str(error).splitlines() or [''])[0]})")


def check_location(location: str | os.PathLike, field: str) -> None:
    """Fail in one line, before any work, when ``location`` cannot hold results: a local path that is (or lies under)
    a file or cannot be created, a bucket that does not exist, an object store that cannot be reached or refuses the
    credentials."""
    from clipcache.storage.errors import ConfigError

    path = as_path(location)
    if not is_remote(path):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError as e:
            raise ConfigError(f"{field}: {path} is a file, not a folder") from e
        except NotADirectoryError as e:
            raise ConfigError(f"{field}: {path} cannot be created: a part of it is a file") from e
        except OSError as e:
            raise ConfigError(f"{field}: {path} cannot be created ({e.strerror})") from e
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{field}: {path} is not writable")
        return
    bucket = path.path.strip("/").split("/")[0]
    try:
        found = path.fs.exists(bucket) if path.protocol not in ("memory",) else True
    except Exception as e:  # fsspec backends raise their own types for unreachable endpoints
        raise _unreachable(field, path, e) from e
    if not found and hasattr(path.fs, "call_s3"):  # s3fs's exists() says False for any failed probe (a 503 too):
        try:  # ask once more, so that only a missing bucket reads as one
            path.fs.call_s3("head_bucket", Bucket=bucket)
            found = True
        except FileNotFoundError:
            pass
        except Exception as e:  # a store that answers 503 or denies the request: its answer, not "no bucket"
            raise _unreachable(field, path, e) from e
    if not found:
        raise ConfigError(f"{field}: bucket {bucket!r} does not exist ({url(path)}); create it or fix the URL")


# What marks a folder as clipcache's own, so that an export or a report is never written into one even when its
# command was not told where it is (storage/embedding_store.py and storage/results.py define these layouts).
CACHE_MARKERS = ("usage", "locks")  # beside embeddings/ in a cache root
WAREHOUSE_TABLES = ("metrics", "runs", "samples")  # folders of <output_dir>/warehouse


def owning_store(path: Path) -> tuple[str, Path] | None:
    """(what, folder) when the local ``path`` (resolved, symlinks followed) is or lies inside an embedding cache or a
    results warehouse recognised by its layout, else None: a cache root holds ``embeddings/`` with ``<key>.zarr``
    entries or ``usage/`` / ``locks/`` beside it; a warehouse is a ``warehouse`` folder holding a table folder."""
    resolved = Path(path).resolve()
    for folder in (resolved, *resolved.parents):
        entries = folder / "embeddings"
        if entries.is_dir() and (any((folder / m).is_dir() for m in CACHE_MARKERS)
                                 or next(entries.glob("*.zarr"), None) is not None):
            return "the embedding cache", folder
        if folder.name == "warehouse" and any((folder / t).is_dir() for t in WAREHOUSE_TABLES):
            return "the results warehouse", folder
    return None


def check_results_folder(output_dir: str | os.PathLike, cache_dir: str | os.PathLike | None,
                         field: str = "output_dir") -> None:
    """ConfigError when the local results folder lies inside an embedding cache (the one named by ``cache_dir`` or
    any folder with a cache's layout): result files written there would land among the cache's entries."""
    from clipcache.storage.errors import ConfigError

    if is_url(output_dir):
        return
    resolved = Path(output_dir).resolve()
    caches = [Path(cache_dir).resolve()] if cache_dir is not None and not is_url(cache_dir) else []
    if (found := owning_store(resolved)) is not None and found[0] == "the embedding cache":
        caches.append(found[1])
    for cache in caches:
        if resolved != cache and resolved.is_relative_to(cache):
            raise ConfigError(f"{field}: {output_dir} is inside the embedding cache ({cache}); results written "
                              f"there would land among its entries: choose a folder outside it")
