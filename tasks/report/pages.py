"""The HTML pages' templates: Jinja2 with autoescaping, shipped beside this module (tasks/report/templates/).

Every value a template prints is escaped unless a template marks it safe, so a model, dataset or caption named
``<script>`` is text on the page, never markup. ``None`` prints as nothing (as a missing cell), and the filters are
the pages' number formats. The templates keep the markup the pages had when they were assembled in Python, byte for
byte up to how an escaped quote is written, so the pages look the same (tests/test_report_templates.py).
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).resolve().parent / "templates"


def number(value: float | None, digits: int = 4) -> str:
    """A metric as the tables show it: fixed digits, an en dash when there is none."""
    return "–" if value is None else f"{value:.{digits}f}"


def when(value: object) -> str:
    """A timestamp to the minute (anything else as text)."""
    return value.strftime("%Y-%m-%d %H:%M") if isinstance(value, datetime) else ("" if value is None else str(value))


def colour(value: float | None) -> str:
    """A heatmap cell's fill: white (0) to blue (1), grey without a value."""
    if value is None:
        return "#eeeeee"
    v = max(0.0, min(1.0, value))
    r, g, b = (int(255 - v * (255 - c)) for c in (33, 102, 172))
    return f"rgb({r},{g},{b})"


def fixed(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}"


def percent(value: float) -> str:
    return f"{value:.2%}"


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             finalize=lambda value: "" if value is None else value)
    env.filters.update(number=number, when=when, fixed=fixed, percent=percent, colour=colour)
    return env


def render(template: str, **context: object) -> str:
    """The page ``template`` (a file under tasks/report/templates/) rendered with ``context``."""
    return environment().get_template(template).render(**context)
