"""Caption files for the captioning task: a user's captions of a dataset's images, and reference captions that
replace the dataset's own.

Two layouts each, the second being the CLIPScore reference implementation's (github.com/jmhessel/clipscore):

- JSON lines: ``{"image": <name>, "caption": "..."}`` (captions) or ``{"image": <name>, "captions": [...]}``
  (references);
- one JSON object: ``{<name>: "caption"}`` (captions) or ``{<name>: ["ref", ...]}`` / ``{<name>: "ref"}``
  (references).

``<name>`` is the image's own name in the dataset (its file relative to the dataset's folder, or its webdataset key),
that name's last component, that component without its extension, or the image's position (``"0"``, ``"1"``, ...).
Every image of the dataset (to ``--limit``) must have an entry; entries for other images are ignored. Files are read
as data, never run.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import sha256_file


def _records(path: Path, what: str) -> dict[str, Any]:
    """``name -> value`` from either layout; one line naming the file and the place of a problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{what} {path}: cannot be read ({type(e).__name__}: {e})") from e
    field = "caption" if what == "captions file" else "captions"
    stripped = text.lstrip()
    if stripped.startswith("{") and path.suffix != ".jsonl":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise DatasetError(f"{what} {path}: not valid JSON ({e})") from e
        if isinstance(data, dict) and not ({"image", field} <= set(data)):
            return {str(k): v for k, v in data.items()}
    out: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise DatasetError(f"{what} {path}, line {number}: not valid JSON ({e})") from e
        if not isinstance(record, dict) or "image" not in record or field not in record:
            raise DatasetError(f"{what} {path}, line {number}: expected {{\"image\": ..., \"{field}\": ...}}")
        out[str(record["image"])] = record[field]
    return out


def _names(dataset: Any, index: int) -> list[str]:
    key = dataset.sample_key(index)
    paths = getattr(dataset, "image_paths", None)  # a custom set's images: their files
    if key is None and paths:
        key = str(paths[index])
    names = [str(index)]
    if key:
        last = PurePosixPath(key).name
        names = [key, last, PurePosixPath(last).stem, *names]
    return names


def _aligned(records: dict[str, Any], dataset: Any, n: int, path: Path, what: str) -> list[Any]:
    values = []
    for i in range(n):
        found = next((records[name] for name in _names(dataset, i) if name in records), None)
        if found is None:
            raise DatasetError(f"{what} {path}: no entry for image {dataset.describe(i)} (named by "
                               f"{' or '.join(map(repr, _names(dataset, i)))}); every image needs one")
        values.append(found)
    return values


def read_captions(path: str | Path, dataset: Any, n: int) -> tuple[list[str], str]:
    """One caption per image of ``dataset`` (its first ``n``), and the file's SHA-256."""
    path = Path(path)
    values = _aligned(_records(path, "captions file"), dataset, n, path, "captions file")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DatasetError(f"captions file {path}: the caption of {dataset.describe(i)} is not a string")
    return values, sha256_file(path)


def read_references(path: str | Path, dataset: Any, n: int) -> tuple[list[list[str]], str]:
    """Reference captions per image of ``dataset`` (its first ``n``), and the file's SHA-256."""
    path = Path(path)
    values = _aligned(_records(path, "references file"), dataset, n, path, "references file")
    out = []
    for i, v in enumerate(values):
        refs = [v] if isinstance(v, str) else v
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
            raise DatasetError(f"references file {path}: the references of {dataset.describe(i)} must be a "
                               f"caption or a non-empty list of captions")
        out.append(refs)
    return out, sha256_file(path)
