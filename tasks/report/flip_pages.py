"""HTML of the comparison pages: an index of the datasets two experiments (or models) share, and per dataset the
samples that flipped each way, with thumbnails, targets and both sides' best-scored classes or items.

Static pages (inline CSS, no scripts, nothing fetched); thumbnails are files beside them, named by image index.
The markup is the Jinja2 templates tasks/report/templates/compare_pair.html.j2, compare_index.html.j2 and
_flips.html.j2 (one macro per kind of row), with autoescaping; this module says which rows a unit gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from clipcache.tasks.report.flips import UnitFlips
from clipcache.tasks.report.sample_media import DatasetView

UNIT_TITLES = {
    "image": "Images",
    "text_query": "Text → image queries (each caption looks for its image)",
    "image_query": "Image → text queries (each image looks for its captions)",
}


@dataclass
class PairPage:
    """One page: experiments A and B on one dataset (split, language, task, precision)."""

    file: str  # the page's file name, beside index.html
    a: dict[str, Any]  # the experiment's columns (compare.paired_experiments)
    b: dict[str, Any]
    units: list[UnitFlips]
    view: DatasetView = field(default_factory=DatasetView)
    thumbs: dict[int, str] = field(default_factory=dict)  # image index -> path relative to the page


@dataclass
class CaptionRow:
    """One image of a captioning comparison: each side's caption, its per-image scores (metric -> value) and the
    image's reference captions."""

    sample_index: int
    a_caption: str | None
    b_caption: str | None
    a_scores: dict[str, float] = field(default_factory=dict)
    b_scores: dict[str, float] = field(default_factory=dict)
    references: list[str] = field(default_factory=list)


@dataclass
class CaptionPage:
    """A captioning comparison page: experiments A and B of ``--task captioning`` on one dataset, each image with
    both captions and its references (a captioning pair has no right-or-wrong flips). ``compare_report`` builds it
    from both sides' sample rows (caption_compare.caption_table): the images whose main score differs most first."""

    file: str
    a: dict[str, Any]
    b: dict[str, Any]
    rows: list[CaptionRow]
    metrics: list[str] = field(default_factory=list)  # the per-image scores shown, in order (the first orders rows)
    view: DatasetView = field(default_factory=DatasetView)
    thumbs: dict[int, str] = field(default_factory=dict)
    n_images: int = 0  # images both sides captioned (the rows shown are the first ``len(rows)`` of them)
    means: tuple[float, float] | None = None  # A's and B's mean of ``metrics[0]`` over all ``n_images``


def side_label(experiment: dict[str, Any]) -> str:
    label = str(experiment["model"]) + (f" @ {experiment['pretrained']}" if experiment.get("pretrained") else "")
    return label + (f" (limit {experiment['sample_limit']})" if experiment.get("sample_limit") is not None else "")


def dataset_label(experiment: dict[str, Any]) -> str:
    parts = [str(experiment["dataset"])]
    if experiment["split"] != "test":
        parts.append(f"({experiment['split']})")
    if experiment["language"] != "en":
        parts.append(f"[{experiment['language']}]")
    if experiment["precision"] != "fp32":
        parts.append(str(experiment["precision"]))
    return " ".join(parts)


# unit -> (the kind of row its table has: a macro of _flips.html.j2, the table's headers)
ROWS: dict[str, tuple[str, list[str]]] = {
    "image": ("image", ["image", "sample", "target", "A's top classes", "B's top classes"]),
    "text_query": ("text_query", ["query caption", "its image", "A's top images", "B's top images"]),
    "image_query": ("image_query", ["image", "A's top captions", "B's top captions"]),
}
GENERIC_ROWS = ("generic", ["sample", "target", "A's top", "B's top"])
TEXT_QUERY_UNITS = ("text_query", "caption")  # a caption's query over the images (both names are in use)
ROWS["caption"] = ROWS["text_query"]
UNIT_TITLES["caption"] = UNIT_TITLES["text_query"]


def table_of(unit: str) -> tuple[str, list[str]]:
    """(the kind of row, the headers) of a unit's flip table."""
    return ROWS.get(unit, GENERIC_ROWS)


def images_shown(unit: UnitFlips) -> set[int]:
    """The image indices a unit's section shows (its thumbnails)."""
    flips = unit.shown_a_only + unit.shown_b_only
    if unit.unit in TEXT_QUERY_UNITS:
        return {i for f in flips for i in [*f.a_top, *f.b_top, *([] if f.target is None else [f.target])]}
    if unit.unit in ("image", "image_query"):
        return {f.sample_index for f in flips}
    return set()


def render_pair_page(page: PairPage, a_selector: str, b_selector: str) -> str:
    from clipcache.tasks.report.pages import render

    a, b = page.a, page.b
    return render("compare_pair.html.j2", page=page, title=f"{dataset_label(a)} · {a['task']}: {side_label(a)} vs "
                                                          f"{side_label(b)}",
                  sides=[(side, selector, side_label(e), e["experiment_id"])
                         for side, selector, e in (("A", a_selector, a), ("B", b_selector, b))],
                  table_of=table_of, unit_titles=UNIT_TITLES)


def render_caption_page(page: CaptionPage, a_selector: str, b_selector: str) -> str:
    from clipcache.tasks.report.pages import render

    a, b = page.a, page.b
    return render("compare_captions.html.j2", page=page,
                  title=f"{dataset_label(a)} · {a['task']}: {side_label(a)} vs {side_label(b)}",
                  sides=[(side, selector, side_label(e), e["experiment_id"])
                         for side, selector, e in (("A", a_selector, a), ("B", b_selector, b))])


def render_index(pages: list[PairPage], skipped: list[tuple[dict[str, Any], dict[str, Any]]], a_selector: str,
                 b_selector: str, *, captions: list[CaptionPage] | None = None) -> str:
    from clipcache.tasks.report.pages import render

    return render("compare_index.html.j2", pages=pages, skipped=skipped, captions=captions or [], a_selector=a_selector,
                  b_selector=b_selector, now=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                  dataset_label=dataset_label)
