"""``--pretrained_model`` as in LAION clip_benchmark: each item is a file of ``ARCH,PRETRAINED`` lines, a collection
name (``openai``, ``openclip_base``, ``openclip_multilingual``, ``openclip_all``) or one ``ARCH,PRETRAINED`` pair,
checked in that order.

Expanding needs no network: the collections are data (collections.json); ``openclip_all`` asks the installed open_clip
for the pairs it knows. Whether each pretrained tag can then be downloaded is the loader's business, model by model.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path

from clipcache.storage.errors import ConfigError

ALL_OPEN_CLIP = "openclip_all"
Pair = tuple[str, str | None]


@cache
def collections() -> dict[str, list[Pair]]:
    data = json.loads(Path(__file__).with_name("collections.json").read_text(encoding="utf-8"))
    return {name: [(arch, tag) for arch, tag in pairs] for name, pairs in data.items() if not name.startswith("_")}


def collection_names() -> list[str]:
    return sorted([*collections(), ALL_OPEN_CLIP])


def _pair(text: str, where: str) -> Pair:
    arch, sep, tag = text.partition(",")
    if not sep or not arch.strip() or "," in tag:
        close = difflib.get_close_matches(text, collection_names(), n=2, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(f"--pretrained_model: {where}{text!r} is not ARCH,PRETRAINED, a collection "
                          f"({', '.join(collection_names())}) or an existing file.{hint}")
    return arch.strip(), tag.strip() or None  # "ARCH," is the architecture with random weights


def _file_pairs(path: Path) -> list[Pair]:
    """One ``ARCH,PRETRAINED`` per line (clip_benchmark's format); blank lines and ``#`` comments are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--pretrained_model: cannot read {path} ({e})") from e
    pairs = [_pair(line.strip(), f"{path} line {n}: ") for n, line in enumerate(lines, start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not pairs:
        raise ConfigError(f"--pretrained_model: {path} lists no ARCH,PRETRAINED line")
    return pairs


def expand_pretrained_models(items: list[str]) -> list[Pair]:
    """Every item of ``--pretrained_model`` as (architecture, pretrained) pairs, in order."""
    pairs: list[Pair] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_file():
            pairs += _file_pairs(path)
        elif item in collections():
            pairs += collections()[item]
        elif item == ALL_OPEN_CLIP:
            import open_clip  # only for this name: everything open_clip can download

            pairs += [(arch, tag) for arch, tag in open_clip.list_pretrained()]
        else:
            pairs.append(_pair(item, ""))
    return pairs
