"""Stable hashes for cache keys and fingerprints of local files."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from filelock import FileLock


def canonical_json(value: object) -> str:
    """JSON with sorted keys and no whitespace: equal values always give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(value: object) -> str:
    """SHA-256 hex digest of a JSON-serialisable value (dict order does not matter)."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class FileHashMemo:
    """Content hashes of local files, remembered by (path, size, mtime) so big files are hashed once.

    The memo is a small JSON file; a stale entry (size or mtime changed) is simply recomputed. Concurrent writers are
    serialised with a file lock and merge their entries, so nothing is lost.
    """

    def __init__(self, memo_path: Path | None):
        self.memo_path = memo_path
        self._entries: dict[str, list] = {}
        self._dirty = False
        if memo_path is not None and memo_path.exists():
            try:
                self._entries = json.loads(memo_path.read_text())
            except (OSError, ValueError):
                self._entries = {}  # a damaged memo only costs re-hashing

    def sha256(self, path: Path) -> str:
        path = Path(path).resolve()
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns]
        hit = self._entries.get(str(path))
        if hit and hit[:2] == stamp:
            return hit[2]
        value = sha256_file(path)
        self._entries[str(path)] = [*stamp, value]
        self._dirty = True
        return value

    def fingerprint(self, paths: Iterable[Path], root: Path | None = None) -> str:
        """One digest over several files: their names (relative to ``root``) and contents."""
        items = []
        for p in paths:
            name = os.path.relpath(p, root) if root is not None else Path(p).name
            items.append([name, self.sha256(Path(p))])
        return digest(items)

    def save(self) -> None:
        if not self._dirty or self.memo_path is None:
            return
        self.memo_path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.memo_path) + ".lock"):
            merged: dict[str, list] = {}
            if self.memo_path.exists():
                try:
                    merged = json.loads(self.memo_path.read_text())
                except (OSError, ValueError):
                    merged = {}
            merged.update(self._entries)
            tmp = self.memo_path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(merged))
            os.replace(tmp, self.memo_path)
        self._dirty = False
