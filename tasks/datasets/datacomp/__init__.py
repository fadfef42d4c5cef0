"""DataComp's evaluation sets beyond clip_benchmark's: WILDS and fairness sets with per-sample metadata
(``wilds/*``, ``fairness/*``: group_layouts.py, group_originals.py, face_attributes.py; source ``group_layouts``)
and WinoGAViL (``misc/winogavil``: winogavil.py; source ``winogavil``).

Light on purpose (the name check reads it, tasks/datasets/declared.py): the names of both sources, and the table
``group_layouts.json`` read once, without the readers' imports."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

WINOGAVIL = "misc/winogavil"  # DataComp's task key, the dataset's name here


@cache
def group_layout_table() -> dict[str, dict[str, Any]]:
    """Dataset name -> its entry of group_layouts.json."""
    data = json.loads(Path(__file__).with_name("group_layouts.json").read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def group_layout_names() -> list[str]:
    return sorted(group_layout_table())


def winogavil_names() -> list[str]:
    return [WINOGAVIL]
