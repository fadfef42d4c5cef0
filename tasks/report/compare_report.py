"""``clipcache report --compare A B``: a folder of static pages showing the samples two experiments (or models)
disagree on, per dataset they share, with thumbnails made from the datasets themselves; for a captioning pair, each
image with both captions and its references.

The folder is built beside its target and renamed over it once complete, so a reader (or an interrupted run) sees
the previous pages or the new ones, whole. It is replaced as a whole, so it must be new, empty, or a folder an
earlier ``report --compare`` wrote (it holds :data:`MARKER`); it may not be, hold or lie inside the warehouse or an
embedding cache the experiments' runs used.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import ConfigError, ResultsError

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

    from clipcache.tasks.report.flip_pages import CaptionPage, PairPage

MARKER = ".clipcache-compare.json"
MAX_FLIPS = 50  # flips shown each way per unit: every one is counted, these many get a row and thumbnails


def default_folder(output_dir: str | os.PathLike, baseline: str, candidate: str) -> Path:
    from clipcache.storage.naming import bounded, path_component

    return Path(output_dir) / "report" / "compare" / bounded(f"{path_component(baseline)}-vs-"
                                                             f"{path_component(candidate)}")


def check_compare_folder(out: str | os.PathLike, output_dir: str | os.PathLike, *,
                         cache_dirs: tuple[str, ...] = (), flag: str = "--out") -> Path:
    """``out`` as a folder these pages may replace, or ConfigError naming why not."""
    from clipcache.storage.warehouse import check_export_path

    for cache_dir in cache_dirs or (None,):
        check_export_path(out, output_dir, cache_dir=cache_dir, flag=flag, folder=True)
    folder = Path(out).resolve()
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MARKER).is_file():
        raise ConfigError(f"{flag}: {out} is a folder that `clipcache report --compare` did not write (it has no "
                          f"{MARKER}); name a new folder, the pages replace the folder as a whole")
    return folder


def write_compare_report(output_dir: str | os.PathLike, baseline: str, candidate: str,
                         out: str | os.PathLike | None = None, *, max_flips: int = MAX_FLIPS,
                         thumbnail_px: int = 96) -> Path:
    """Write the pages into ``out`` (default: ``<output_dir>/report/compare/<A>-vs-<B>``); returns its index.html."""
    from clipcache.storage.warehouse import read_results
    from clipcache.tasks.report.caption_compare import caption_table
    from clipcache.tasks.report.compare import paired_experiments
    from clipcache.tasks.report.flip_pages import CaptionPage, PairPage
    from clipcache.tasks.report.flips import unit_flips
    from clipcache.tasks.report.sample_media import experiment_source

    def read(con: DuckDBPyConnection) -> tuple[list[Any], dict[str, Any], list[tuple[Any, Any, Any]]]:
        """Everything the pages show, read from one view of the files (before or after a concurrent compaction):
        per pair its flips, or a captioning pair's captions (which have no right-or-wrong outcome)."""
        pairs = paired_experiments(con, baseline, candidate)
        sources = {e["experiment_id"]: experiment_source(con, e["experiment_id"]) for pair in pairs for e in pair}
        found = [(a, b, caption_table(con, a["experiment_id"], b["experiment_id"], limit=max_flips)
                  if a["task"] == "captioning" else
                  unit_flips(con, a["experiment_id"], b["experiment_id"], cap=max_flips, dataset=a["dataset"]))
                 for a, b in pairs]
        return pairs, sources, found

    _, sources, found = read_results(output_dir, read)
    cache_dirs = tuple(sorted({str(s["config"]["cache_dir"]) for s in sources.values()
                               if s and s["config"].get("cache_dir")}))
    target = check_compare_folder(out or default_folder(output_dir, baseline, candidate), output_dir,
                                  cache_dirs=cache_dirs)
    pages: list[PairPage] = []
    captions: list[CaptionPage] = []
    skipped: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for a, b, shown in found:
        name = _page_name(a, len(pages) + len(captions))
        if not shown:
            skipped.append((a, b))
        elif a["task"] == "captioning":
            captions.append(CaptionPage(name, a, b, shown.rows, shown.metrics, n_images=shown.n_images,
                                        means=shown.means))
        else:
            pages.append(PairPage(name, a, b, shown))
    if not pages and not captions:
        raise ResultsError("compare: none of the paired experiments has sample rows with a right-or-wrong outcome "
                           "or a caption to page through (they are written by clipcache 0.2 and newer, and "
                           "`clipcache rescore` adds them from the cache; WinoGAViL's games have a score instead: "
                           "`clipcache compare` compares them)")
    _publish(target, lambda staging: _write_pages(staging, pages, skipped, sources, captions=captions,
                                                  baseline=baseline, candidate=candidate, thumbnail_px=thumbnail_px))
    return target / "index.html"


def _page_name(experiment: dict[str, Any], n: int) -> str:
    from clipcache.storage.naming import bounded, path_component

    parts = [experiment["dataset"], experiment["split"], experiment["language"], experiment["task"],
             experiment["precision"]]
    return bounded(f"{n:02d}-{path_component('_'.join(str(p) for p in parts))}") + ".html"


def _write_pages(folder: Path, pages: list[PairPage], skipped: list[tuple[dict[str, Any], dict[str, Any]]],
                 sources: dict[str, dict[str, Any]], *, captions: list[CaptionPage], baseline: str, candidate: str,
                 thumbnail_px: int) -> None:
    from clipcache.tasks.report.flip_pages import (
        PairPage,
        images_shown,
        render_caption_page,
        render_index,
        render_pair_page,
    )
    from clipcache.tasks.report.sample_media import open_view, write_thumbnail

    every: list[PairPage | CaptionPage] = [*pages, *captions]
    for page in every:
        # A's run opened the data; B's may have had it elsewhere (another machine, a moved folder)
        view = open_view(sources[page.a["experiment_id"]])
        if view.dataset is None:
            other = open_view(sources[page.b["experiment_id"]])
            view = other if other.dataset is not None else view
        page.view = view
        stem = page.file.removesuffix(".html")
        if isinstance(page, PairPage):
            shown = sorted({i for unit in page.units for i in images_shown(unit)})
        else:
            shown = sorted(row.sample_index for row in page.rows)  # a captioning row is an image
        for index in shown:
            relative = f"thumbs/{stem}/{index}.jpg"
            if write_thumbnail(view, index, folder / relative, thumbnail_px):
                page.thumbs[index] = relative
        html = (render_pair_page(page, baseline, candidate) if isinstance(page, PairPage)
                else render_caption_page(page, baseline, candidate))
        (folder / page.file).write_text(html, encoding="utf-8")
    (folder / "index.html").write_text(render_index(pages, skipped, baseline, candidate, captions=captions),
                                       encoding="utf-8")
    marker = {"baseline": baseline, "candidate": candidate,
              "pairs": [[p.a["experiment_id"], p.b["experiment_id"]] for p in every]}
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")


def _publish(target: Path, write: Callable[[Path], None]) -> None:
    """``write(staging)`` into a folder beside ``target``, then swap it in: the old pages are renamed aside (a
    staging name, swept if this process dies) before the new folder takes their name, and removed after."""
    from clipcache.storage.atomic import staging_dir
    from clipcache.storage.paths import lock

    with lock(target.parent / f".{target.name}.lock"):  # two reports into one folder take turns
        staging = staging_dir(target)
        try:
            write(staging)
            if target.exists():
                old = staging_dir(target)  # an empty folder: a folder may be renamed over it
                os.replace(target, old)
                os.replace(staging, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
