"""HTML of the comparison pages: an index of the datasets two experiments (or models) share, and per dataset the
samples that flipped each way, with thumbnails, targets and both sides' best-scored classes or items.

Static pages (inline CSS, no scripts, nothing fetched); thumbnails are files beside them, named by image index.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from clipcache.tasks.report.flips import Flip, UnitFlips
from clipcache.tasks.report.html import CSS
from clipcache.tasks.report.sample_media import DatasetView

PAGE_CSS = CSS + """
img.thumb{display:block;border:3px solid transparent;border-radius:3px;image-rendering:pixelated;
 min-width:48px;min-height:48px;background:#f6f8fa}
img.thumb.hit{border-color:#1a7f37} .noimg{display:inline-block;width:48px;height:48px;background:#eeeeee;
 color:#656d76;font-size:11px;text-align:center;line-height:48px}
.gallery{display:flex;gap:4px;align-items:flex-start} ol.top{margin:0;padding-left:20px} li.hit{color:#1a7f37;
 font-weight:600} .count{font-variant-numeric:tabular-nums} td{vertical-align:top}
"""

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


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


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


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{PAGE_CSS}</style></head><body>{body}</body></html>")


def _thumb(page: PairPage, index: int, hit: bool = False) -> str:
    path = page.thumbs.get(index)
    if path is None:
        return f"<span class='noimg' title='image {index}'>#{index}</span>"
    cls = "thumb hit" if hit else "thumb"
    return f"<img class='{cls}' src='{_e(path)}' alt='image {index}' title='image {index}'>"


def _class_list(page: PairPage, top: list[int], target: int | None, rank: int | None) -> str:
    items = "".join(f"<li class='hit'>{_e(page.view.class_name(c))}</li>" if c == target
                    else f"<li>{_e(page.view.class_name(c))}</li>" for c in top)
    where = f"<div class='muted'>target rank {rank}</div>" if rank is not None else ""
    return f"<ol class='top'>{items}</ol>{where}"


def _image_row(page: PairPage, flip: Flip) -> list[str]:
    key = f"<div class='muted'>{_e(flip.sample_key)}</div>" if flip.sample_key else ""
    return [_thumb(page, flip.sample_index), f"#{flip.sample_index}{key}", _e(page.view.class_name(flip.target)),
            _class_list(page, flip.a_top, flip.target, flip.a_rank),
            _class_list(page, flip.b_top, flip.target, flip.b_rank)]


def _text_query_row(page: PairPage, flip: Flip) -> list[str]:
    def gallery(top: list[int]) -> str:
        return "<div class='gallery'>" + "".join(_thumb(page, i, i == flip.target) for i in top) + "</div>"

    target = "–" if flip.target is None else _thumb(page, flip.target, True)
    return [_e(page.view.caption(flip.sample_index)), target, gallery(flip.a_top), gallery(flip.b_top)]


def _image_query_row(page: PairPage, flip: Flip) -> list[str]:
    own = page.view.caption_image

    def captions(top: list[int]) -> str:
        return "<ol class='top'>" + "".join(
            f"<li class='hit'>{_e(page.view.caption(c))}</li>" if 0 <= c < len(own) and own[c] == flip.sample_index
            else f"<li>{_e(page.view.caption(c))}</li>" for c in top) + "</ol>"

    return [_thumb(page, flip.sample_index), captions(flip.a_top), captions(flip.b_top)]


ROWS: dict[str, tuple[list[str], Callable[[PairPage, Flip], list[str]]]] = {
    "image": (["image", "sample", "target", "A's top classes", "B's top classes"], _image_row),
    "text_query": (["query caption", "its image", "A's top images", "B's top images"], _text_query_row),
    "image_query": (["image", "A's top captions", "B's top captions"], _image_query_row),
}
TEXT_QUERY_UNITS = ("text_query", "caption")  # a caption's query over the images (both names are in use)
ROWS["caption"] = ROWS["text_query"]
UNIT_TITLES["caption"] = UNIT_TITLES["text_query"]


def _generic_row(page: PairPage, flip: Flip) -> list[str]:
    return [f"#{flip.sample_index}", _e(flip.target), _e(flip.a_top), _e(flip.b_top)]


def images_shown(unit: UnitFlips) -> set[int]:
    """The image indices a unit's section shows (its thumbnails)."""
    flips = unit.shown_a_only + unit.shown_b_only
    if unit.unit in TEXT_QUERY_UNITS:
        return {i for f in flips for i in [*f.a_top, *f.b_top, *([] if f.target is None else [f.target])]}
    if unit.unit in ("image", "image_query"):
        return {f.sample_index for f in flips}
    return set()


def _flip_table(page: PairPage, unit: str, flips: list[Flip]) -> str:
    headers, row = ROWS.get(unit, (["sample", "target", "A's top", "B's top"], _generic_row))
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row(page, f)) + "</tr>" for f in flips)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(page: PairPage, unit: UnitFlips) -> str:
    u = _e(unit.unit)
    parts = [f"<section class='unit' data-unit='{u}'><h2>{_e(UNIT_TITLES.get(unit.unit, unit.unit))}</h2>",
             f"<p>{unit.n} samples · correct@1: A {unit.a_correct} ({unit.a_correct / unit.n:.2%}), "
             f"B {unit.b_correct} ({unit.b_correct / unit.n:.2%}) · "
             f"A right, B wrong: <strong class='count' id='{u}-a-only'>{unit.a_only}</strong> · "
             f"B right, A wrong: <strong class='count' id='{u}-b-only'>{unit.b_only}</strong></p>"]
    for title, total, shown in (("A right, B wrong", unit.a_only, unit.shown_a_only),
                                ("B right, A wrong", unit.b_only, unit.shown_b_only)):
        parts.append(f"<h3>{title} ({total})</h3>")
        if not total:
            parts.append("<p class='muted'>None.</p>")
            continue
        more = total - len(shown)
        parts.append(f"<p class='muted'>{len(shown)} shown, the wrong side's most confident mistakes first (the "
                     f"lowest margin of its target, where the rows have one; else in sample order)"
                     + (f"; {more} more not shown" if more else "") + ".</p>")
        parts.append(_flip_table(page, unit.unit, shown))
    parts.append("</section>")
    return "".join(parts)


def render_pair_page(page: PairPage, a_selector: str, b_selector: str) -> str:
    a, b = page.a, page.b
    title = f"{dataset_label(a)} · {a['task']}: {side_label(a)} vs {side_label(b)}"
    notes = f"<p class='muted'>Images not shown: {_e(page.view.problem)}</p>" if page.view.problem else ""
    sides = "".join(f"<tr><td>{side}</td><td>{_e(selector)}</td><td>{_e(side_label(e))}</td>"
                    f"<td><code>{_e(e['experiment_id'])}</code></td></tr>"
                    for side, selector, e in (("A", a_selector, a), ("B", b_selector, b)))
    body = [f"<p><a href='index.html'>← all datasets</a></p><h1>{_e(title)}</h1>",
            f"<table><thead><tr><th></th><th>asked for</th><th>model</th><th>experiment</th></tr></thead>"
            f"<tbody>{sides}</tbody></table>",
            "<p class='muted'>A sample flips when it is right at rank 1 for one side and wrong for the other "
            "(correct@1 of the warehouse's samples rows, latest completed run of each experiment). Green: the "
            "target (or a right item).</p>", notes]
    body += [_section(page, unit) for unit in page.units]
    return _page(title, "".join(body))


def render_index(pages: list[PairPage], skipped: list[tuple[dict[str, Any], dict[str, Any]]], a_selector: str,
                 b_selector: str) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for page in pages:
        for unit in page.units:
            ref = _e(f"{page.file.removesuffix('.html')}-{unit.unit}")
            rows.append(f"<tr><td><a href='{_e(page.file)}'>{_e(dataset_label(page.a))}</a></td>"
                        f"<td>{_e(page.a['task'])}</td><td>{_e(unit.unit)}</td><td class='num'>{unit.n}</td>"
                        f"<td class='num'>{unit.a_correct / unit.n:.4f}</td>"
                        f"<td class='num'>{unit.b_correct / unit.n:.4f}</td>"
                        f"<td class='num' id='{ref}-a-only'>{unit.a_only}</td>"
                        f"<td class='num' id='{ref}-b-only'>{unit.b_only}</td></tr>")
    for a, _ in skipped:
        rows.append(f"<tr><td>{_e(dataset_label(a))}</td><td>{_e(a['task'])}</td>"
                    f"<td colspan='6' class='muted'>no per-sample rows on one side (a task that does not keep them "
                    f"yet, or a run of an older release)</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("dataset", "task", "unit", "samples", "A correct@1", "B correct@1",
                                             "A right, B wrong", "B right, A wrong"))
    body = (f"<h1>What changed: {_e(b_selector)} vs {_e(a_selector)}</h1>"
            f"<p class='muted'>A = {_e(a_selector)}, B = {_e(b_selector)} · generated {now} · the samples that "
            f"flipped each way, per dataset the two share</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    return _page(f"clipcache: {b_selector} vs {a_selector}", body)
