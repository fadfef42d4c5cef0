"""Write files so that readers see either the old state or the complete new one, never a partial file.

Temporary files and staging folders are named ``.<name>.<host>.<pid>.<random>.tmp`` beside their target. A writer
killed between writing and renaming leaves one behind; the next write into that folder removes those whose writer
(same host, that pid) is no longer alive, so a killed run leaves nothing once its re-run has written. Each folder is swept once per process (the warehouse's
folders hold thousands of files; a writer that dies during this run is swept by the next one).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from clipcache.storage import faults
from clipcache.storage.paths import is_remote, write_via_temp

_HOST = socket.gethostname().replace(".", "-") or "host"
_swept: set[Path] = set()


def _temp_name(path: Path) -> str:
    return f".{path.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(6)}.tmp"


def process_alive(pid: int) -> bool:
    """Whether a process of this host has that pid (signal 0: exists; EPERM: exists, someone else's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(folder: Path) -> int:
    """Remove the temporary files and staging folders in ``folder`` left by writers of this host that are gone."""
    removed = 0
    try:
        candidates = [p for p in Path(folder).iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    except OSError:
        return 0
    for candidate in candidates:
        parts = candidate.name.rsplit(".", 4)  # [".<name>", host, pid, random, "tmp"]
        if len(parts) != 5 or parts[1] != _HOST or not parts[2].isdigit() or process_alive(int(parts[2])):
            continue
        try:
            if candidate.is_dir() and not candidate.is_symlink():
                shutil.rmtree(candidate)
            else:
                candidate.unlink()
            removed += 1
        except FileNotFoundError:
            pass  # another writer swept it first
    return removed


def _sweep_once(folder: Path) -> None:
    if folder not in _swept:
        sweep_stale(folder)
        _swept.add(folder)


def _create_temp(path: Path) -> Path:
    """An empty, new temporary file beside ``path``, created with mode 0o666 so that the kernel applies the umask in
    force now (mkstemp's 0o600 would publish files that only their owner can read; a umask read once at import would
    miss a later change)."""
    _sweep_once(path.parent)
    while True:
        tmp = path.parent / _temp_name(path)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def staging_dir(path: Path) -> Path:
    """A new, empty folder beside ``path`` to fill and then rename over it. Created with mode 0o777 for the same
    reason as the files above: mkdtemp's 0o700 would publish a folder that only its owner can enter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_once(path.parent)
    while True:
        staging = path.parent / _temp_name(path)
        try:
            os.mkdir(staging, 0o777)
            return staging
        except FileExistsError:
            continue


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file over ``path`` (same directory, so the rename is atomic).

    On an object store (``path`` a ``UPath``) the file is uploaded in one piece instead: an object appears whole."""
    if is_remote(path):
        write_via_temp(path, write)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temp(path)
    try:
        write(tmp)
        faults.point("atomic-write")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    atomic_write(path, write)


def atomic_write_json(path: Path, value: object, indent: int | None = None) -> None:
    atomic_write_text(path, json.dumps(value, indent=indent, ensure_ascii=False, allow_nan=False) + "\n")
