"""Caption setups (storage/caption_cache.py) as ``clipcache cache`` sees them: listed beside the embedding entries,
verified, removed, and collected by ``cache gc`` by age, pattern or size.

A setup is ``captions/<key>.setup.json`` (what made the captions: an open_clip model's identity and its decoding
settings, or a VLM's API base, prompt and parameters), ``captions/<key>.jsonl`` (one caption per image content
hash), the claims file ``captions/<key>.lock`` of convert's concurrent captioners and, for a generating model,
``captions/<key>.meta.json`` (the model's name, which its identity in the setup does not hold). Its key is the digest of the setup, so a
setup file whose content no longer hashes to its name was edited or damaged. Caption setups live beside a local
cache only (a remote cache has none).

Removing a setup takes the whole claims file first: a ``convert`` captioning with the setup holds a claim on every
image it is asking about, so ``gc`` keeps such a setup (in use) and ``rm`` waits for a moment without claims.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

from clipcache.storage.cache_admin import EntryInfo, _iso
from clipcache.storage.hashing import digest
from clipcache.storage.paths import AnyPath, is_remote

KIND = "captions"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SUFFIXES = (".jsonl", ".setup.json", ".meta.json", ".lock")


def captions_dir(cache_root: AnyPath) -> Path | None:
    """``<cache_dir>/captions`` of a local cache (None for a remote one, which holds no captions)."""
    return None if is_remote(cache_root) else Path(cache_root) / "captions"


def setup_keys(folder: Path | None) -> list[str]:
    """Every setup with a file in ``folder``, damaged ones included (``verify`` and ``rm`` see them too)."""
    if folder is None or not folder.is_dir():
        return []
    keys = {p.name.removesuffix(suffix) for suffix in (".jsonl", ".setup.json") for p in folder.glob("*" + suffix)}
    return sorted(k for k in keys if re.fullmatch(r"[0-9a-f]{64}", k))


def _folder(cache_root: AnyPath) -> Path:
    return Path(str(cache_root)) / "captions"


def read_setup(cache_root: AnyPath, key: str) -> dict[str, Any] | None:
    """A setup's settings as its file holds them (None when missing or unreadable)."""
    folder = _folder(cache_root)
    try:
        setup = json.loads((folder / f"{key}.setup.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return setup if isinstance(setup, dict) else None


def settings_text(setup: dict[str, Any]) -> str:
    """What, besides the model, made the captions, in one line: decoding settings, or a VLM's prompt and
    parameters."""
    shown = {k: v for k, v in setup.items() if k not in ("model", "generator")}
    decoding = shown.pop("decoding", None)
    parts = [f"{k}={v}" for k, v in (decoding or {}).items()]
    parts += [f"{k}={json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}" for k, v in shown.items()]
    return ", ".join(parts)


def _records(path: Path) -> tuple[dict[str, str], list[str]]:
    """The captions of a setup file (image hash -> caption, the last line winning as on read) and its problems. A
    last line cut off mid-write (an interrupted run) is no problem: the cache ignores it and that image is
    captioned again."""
    captions: dict[str, str] = {}
    problems: list[str] = []
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return captions, problems
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            image, caption = record["image"], record["caption"]
            if not (isinstance(image, str) and _SHA256.match(image) and isinstance(caption, str)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            if number == len(lines):  # no newline after it: torn by an interrupted write
                continue
            problems.append(f"{path.name}, line {number}: not a caption record ({{\"image\": <sha256>, "
                            f"\"caption\": <text>}})")
            continue
        captions[image] = caption
    return captions, problems


def _bytes(folder: Path, key: str) -> int:
    return sum((folder / f"{key}{s}").stat().st_size for s in SUFFIXES if (folder / f"{key}{s}").is_file())


def describe_setup(cache_root: AnyPath, key: str) -> EntryInfo:
    """A setup as a ``cache ls`` row: kind ``captions``, ``count`` its captioned images, ``settings`` its decoding
    settings or prompt; created when its setup file was written, last used when a caption was last added."""
    folder = _folder(cache_root)
    setup = read_setup(cache_root, key) or {}
    try:  # the model's name where the setup holds its identity (CoCa's: loader, config, weights hash)
        model = json.loads((folder / f"{key}.meta.json").read_text(encoding="utf-8"))["model"]
    except (OSError, ValueError, KeyError, TypeError):
        model = setup.get("model", "?")
    captions, _ = _records(folder / f"{key}.jsonl")
    stamps = [p.stat().st_mtime for p in (folder / f"{key}.setup.json", folder / f"{key}.jsonl") if p.is_file()]
    return EntryInfo(key=key, kind=KIND, model=model if isinstance(model, str) else "?", dataset="-", split="-",
                     count=len(captions), dim=0, dtype="text", bytes=_bytes(folder, key),
                     created=_iso(min(stamps)) if stamps else "?", last_used=_iso(max(stamps)) if stamps else "?",
                     role="caption", settings=settings_text(setup), tasks=("captioning",))


def list_setups(cache_root: AnyPath) -> list[EntryInfo]:
    return [describe_setup(cache_root, k) for k in setup_keys(captions_dir(cache_root))]


def verify_setup(cache_root: AnyPath, key: str) -> list[str]:
    """Problems of one setup: a setup file that is missing, unreadable or no longer hashes to its key (edited),
    and caption lines that are not caption records."""
    folder = _folder(cache_root)
    problems = []
    setup = read_setup(cache_root, key)
    if setup is None:
        problems.append(f"{key}.setup.json: missing or not a JSON object (the captions cannot be told apart from "
                        f"another setup's)")
    elif digest(setup) != key:
        problems.append(f"{key}.setup.json: its content does not hash to its key (edited or damaged)")
    problems += _records(folder / f"{key}.jsonl")[1]
    return problems


def remove_setup(cache_root: AnyPath, key: str, *, wait: bool = True) -> int | None:
    """Delete a setup's files; the bytes freed. The claims file is locked as a whole first: with ``wait=False`` a
    setup that a running convert holds claims on is left alone (None)."""
    folder = _folder(cache_root)
    freed = _bytes(folder, key)
    lock = folder / f"{key}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB), 0, 0)  # length 0: the whole file
        except OSError:
            return None
        for suffix in (".jsonl", ".setup.json", ".meta.json"):
            (folder / f"{key}{suffix}").unlink(missing_ok=True)
        lock.unlink(missing_ok=True)
    finally:
        os.close(fd)
    return freed
