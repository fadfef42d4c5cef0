"""Class names and templates in other languages for zero-shot classification.

Shipped: ImageNet-1k in en, cn, jp, ar, it (``prompts/imagenet1k.json``, from LAION clip_benchmark's data files; see
its ``_provenance``). A dataset qualifies when each of its English class names is an ImageNet-1k class name, so the
1000-class variants (imagenetv2, imagenet_sketch) and the 200-class subsets (imagenet-a, imagenet-r, imagenet-o) map
class by class; anything else says which languages it has. Unlike clip_benchmark, this also applies to webdataset
sources (clip_benchmark ignores --language there and labels the result with the language anyway).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from clipcache.storage.errors import ConfigError
from clipcache.tasks.datasets.base import ClassPrompts

DATA = Path(__file__).with_name("prompts") / "imagenet1k.json"


@cache
def imagenet_prompts() -> dict[str, dict[str, list[str]]]:
    return {k: v for k, v in json.loads(DATA.read_text(encoding="utf-8")).items() if not k.startswith("_")}


def languages() -> list[str]:
    return sorted(imagenet_prompts())


def imagenet_positions(names: list[str], english: list[str]) -> list[int | None]:
    """Each of ``names``'s index among ImageNet's 1,000 English class names. Two names occur twice there ("missile":
    classes 657 and 744; "sunglasses": 836 and 837), so a name takes its first occurrence after the previous class's:
    the 1,000-class lists map one to one, and the 200-class subsets, which keep ImageNet's order, to their own
    classes (ImageNet-R's "missile" is 657, as clip_benchmark's masked lists have it)."""
    where: dict[str, list[int]] = {}
    for i, name in enumerate(english):
        where.setdefault(name, []).append(i)
    positions: list[int | None] = []
    last = -1
    for name in names:
        found = where.get(name, [])
        position = next((i for i in found if i > last), found[0] if found else None)
        positions.append(position)
        last = position if position is not None else last
    return positions


def localize(prompts: ClassPrompts, dataset: str, language: str) -> ClassPrompts:
    """``prompts`` (English, from the dataset) in ``language``; ConfigError if that language is not available."""
    if language == prompts.language:
        return prompts
    data = imagenet_prompts()
    positions = imagenet_positions(prompts.classnames, data["en"]["classnames"])
    if language not in data or any(p is None for p in positions):
        available = [prompts.language] + ([lang for lang in languages() if lang != prompts.language]
                                          if all(p is not None for p in positions) else [])
        raise ConfigError(f"language: {language!r} is not available for dataset {dataset!r} (available: "
                          f"{', '.join(available)}; other languages: --classnames / --templates files)")
    target = data[language]
    return ClassPrompts([target["classnames"][p] for p in positions if p is not None], list(target["templates"]),
                        language,
                        f"{DATA.name} ({language})")
