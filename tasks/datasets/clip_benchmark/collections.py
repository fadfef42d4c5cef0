"""``--dataset`` as in LAION clip_benchmark: each item is a file of names (one per line), a collection (``vtab``,
``vtab+``, ``retrieval``, ``imagenet_robustness``, ``sugar_crepe``; collections.json beside this module) or a name.
clip_benchmark's ``vtab/<x>`` spelling is clipcache's catalog name ``vtab_<x>``."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from clipcache.storage.errors import ConfigError


@cache
def dataset_collections() -> dict[str, list[str]]:
    data = json.loads(Path(__file__).with_name("collections.json").read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def canonical(name: str) -> str:
    """clip_benchmark's ``vtab/caltech101`` -> ``vtab_caltech101`` (a catalog name); other names unchanged."""
    from clipcache.tasks.datasets import catalog

    if name.startswith("vtab/") and (alias := "vtab_" + name[len("vtab/"):]) in catalog():
        return alias
    return name


def expand_datasets(items: list[str]) -> list[str]:
    """Files and collections expanded in place, names made canonical, repeats dropped (first one kept)."""
    names: list[str] = []
    for item in items:
        path = Path(item).expanduser()
        if item not in dataset_collections() and path.is_file():
            try:
                lines = path.read_text(encoding="utf-8-sig").splitlines()
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(f"datasets: cannot read the list of names in {path} ({e})") from e
            found = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
            if not found:
                raise ConfigError(f"datasets: {path} lists no dataset names (one per line)")
            names += found
        elif item in dataset_collections():
            names += dataset_collections()[item]
        else:
            names.append(item)
    return list(dict.fromkeys(canonical(n) for n in names))
