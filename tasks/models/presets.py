"""Hugging Face / ModelScope ids clipcache lists in `clipcache models` (presets.json)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any


@cache
def presets() -> dict[str, Any]:
    return json.loads((Path(__file__).with_name("presets.json")).read_text(encoding="utf-8"))
