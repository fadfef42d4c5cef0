"""Captions from a multimodal LLM, persisted as they arrive.

One append-only JSON-lines file per captioning setup: ``<cache_dir>/captions/<setup key>.jsonl`` where the key is
the digest of (model, api_base, prompt, generation parameters) — never the API key. Each line is
``{"image": <sha256 of the image bytes>, "caption": ...}``, written and flushed as soon as a response arrives, so a
crash or Ctrl-C loses at most the requests in flight. A torn last line (killed mid-write) is ignored on read.

Several processes may caption with one setup at once (two identical conversions, or two datasets sharing images):
before asking the API for an image, a process claims it with a one-byte ``fcntl`` lock in ``<setup key>.lock`` at an
offset taken from the image's hash; another process that finds the image claimed works on other images meanwhile
and later reads the caption from the file (``refresh``). The kernel drops a dead process's claims, so a killed
conversion blocks nobody.

The same files hold the captions an open_clip generative model (CoCa) writes for ``--task captioning``: their setup
names the model, precision and decoding settings instead of an API. :func:`open_setup` opens an existing setup by
(a prefix of) its key, read-only, so the captions of a conversion can be scored without calling the API again.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clipcache.storage import faults
from clipcache.storage.errors import ConfigError
from clipcache.storage.hashing import digest


class CaptionCache:
    def __init__(self, cache_dir: str | Path, setup: dict[str, Any], *, create: bool = True,
                 label: str | None = None):
        self.setup = setup
        self.key = digest(setup)
        self.path = Path(cache_dir) / "captions" / f"{self.key}.jsonl"
        self._lock = threading.Lock()
        self._known: dict[str, str] = {}
        self._offset = 0  # bytes of the file read so far
        self._claims_fd: int | None = None  # one descriptor for the process's lifetime: closing any would drop claims
        if self.path.exists():
            raw = self.path.read_bytes()
            if raw and not raw.endswith(b"\n"):  # end a torn line so the next record starts on its own line
                with open(self.path, "ab") as f:
                    f.write(b"\n")
            self.refresh()
        if create and not (self.path.parent / f"{self.key}.setup.json").exists():
            # (also when its captions are there without it: removed by `cache rm` while a run was writing)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            (self.path.parent / f"{self.key}.setup.json").write_text(json.dumps(setup, indent=1))
        meta = self.path.parent / f"{self.key}.meta.json"
        if create and label is not None and not meta.exists():  # how `cache ls` names the model (not in the key)
            meta.write_text(json.dumps({"model": label}))

    def refresh(self) -> int:
        """Read the lines other processes appended since the last read; returns how many captions were new."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                raw = f.read()
        except FileNotFoundError:
            return 0
        complete = raw[: raw.rfind(b"\n") + 1]  # a line still being written is read next time
        self._offset += len(complete)
        new = 0
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
                new += record["image"] not in self._known
                self._known[record["image"]] = record["caption"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn line from an interrupted write
        return new

    def _claim_offset(self, image_sha256: str) -> int:
        return int(image_sha256[:10], 16)

    def _claims(self) -> int:
        if self._claims_fd is None:
            self._claims_fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o666)
        return self._claims_fd

    @contextmanager
    def holding(self) -> Iterator[None]:
        """A shared lock over the whole claims file while this process writes captions without claiming images one
        by one (a model generating them): ``clipcache cache gc`` keeps the setup meanwhile and ``cache rm`` waits
        (storage/caption_admin.py)."""
        fd = self._claims()
        fcntl.lockf(fd, fcntl.LOCK_SH, 0, 0)
        try:
            yield
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)

    def try_claim(self, image_sha256: str) -> bool:
        """Claim an image for this process (non-blocking); False while another process has it."""
        try:
            fcntl.lockf(self._claims(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self._claim_offset(image_sha256))
            return True
        except OSError:
            return False

    def release(self, image_sha256: str) -> None:
        if self._claims_fd is not None:
            fcntl.lockf(self._claims_fd, fcntl.LOCK_UN, 1, self._claim_offset(image_sha256))

    def get(self, image_sha256: str) -> str | None:
        return self._known.get(image_sha256)

    def __len__(self) -> int:
        return len(self._known)

    def put(self, image_sha256: str, caption: str) -> None:
        line = json.dumps({"image": image_sha256, "caption": caption}, ensure_ascii=False) + "\n"
        faults.point("caption")
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
        self._known[image_sha256] = caption


def image_keys_path(cache_dir: str | Path, data_key: str) -> Path:
    """Where the content keys of one dataset's images are kept (``data_key``: a digest of the images' identity):
    a rescore finds each image's caption without decoding the image again."""
    return Path(cache_dir) / "captions" / "image_keys" / f"{data_key}.json"


def read_image_keys(cache_dir: str | Path, data_key: str, n: int) -> list[str] | None:
    try:
        keys = json.loads(image_keys_path(cache_dir, data_key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(keys, list) and len(keys) == n and all(isinstance(k, str) and len(k) == 64 for k in keys):
        return keys
    return None


def write_image_keys(cache_dir: str | Path, data_key: str, keys: list[str]) -> None:
    from clipcache.storage.atomic import atomic_write_json

    path = image_keys_path(cache_dir, data_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, keys)


def caption_setups(cache_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Every captioning setup with captions in ``cache_dir``: key -> setup."""
    folder = Path(cache_dir) / "captions"
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.setup.json")) if folder.is_dir() else []:
        key = path.name.removesuffix(".setup.json")
        try:
            setup = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(setup, dict) and digest(setup) == key and (folder / f"{key}.jsonl").is_file():
            found[key] = setup
    return found


def open_setup(cache_dir: str | Path, key_prefix: str) -> CaptionCache:
    """The captions of the existing setup whose key starts with ``key_prefix`` (read-only: nothing is created)."""
    setups = caption_setups(cache_dir)
    matches = [k for k in setups if k.startswith(key_prefix)] if key_prefix else []
    if len(matches) != 1:
        known = ", ".join(f"{k[:12]} ({setups[k].get('model', '?')})" for k in setups) or "none"
        what = "no captioning setup" if not matches else f"{len(matches)} captioning setups"
        raise ConfigError(f"captions: {what} in {Path(cache_dir) / 'captions'} with a key starting with "
                          f"{key_prefix!r} (there: {known})")
    return CaptionCache(cache_dir, setups[matches[0]], create=False)
