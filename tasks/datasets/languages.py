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


def localize(prompts: ClassPrompts, dataset: str, language: str) -> ClassPrompts:
    """``prompts`` (English, from the dataset) in ``language``; ConfigError if that language is not available."""
    if language == prompts.language:
        return prompts
    data = imagenet_prompts()
    index = {name: i for i, name in enumerate(data["en"]["classnames"])}
    positions = [index.get(name) for name in prompts.classnames]
    if language not in data or any(p is None for p in positions):
        available = [prompts.language] + ([lang for lang in languages() if lang != prompts.language]
                                          if all(p is not None for p in positions) else [])
        raise ConfigError(f"language: {language!r} is not available for dataset {dataset!r} (available: "
                          f"{', '.join(available)}; other languages: --classnames / --templates files)")
    target = data[language]
    return ClassPrompts([target["classnames"][p] for p in positions if p is not None], list(target["templates"]),
                        language,
                        f"{DATA.name} ({language})")
