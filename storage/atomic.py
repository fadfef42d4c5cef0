"""Write files so that readers see either the old state or the complete new one, never a partial file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clipcache.storage.paths import is_remote, write_via_temp

# mkstemp creates files readable by their owner only; published files get the mode a plain open() would give them.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file over ``path`` (same directory, so the rename is atomic).

    On an object store (``path`` a ``UPath``) the file is uploaded in one piece instead: an object appears whole."""
    if is_remote(path):
        write_via_temp(path, write)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    atomic_write(path, write)


def atomic_write_json(path: Path, value: Any, indent: int | None = None) -> None:
    atomic_write_text(path, json.dumps(value, indent=indent, ensure_ascii=False, allow_nan=False) + "\n")
