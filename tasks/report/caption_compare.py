"""Two captioning experiments image by image: each image's two captions, its references and each side's per-image
score, read from the warehouse's sample rows (the ``caption_pairs`` macro, storage/warehouse.py).

``clipcache compare`` shows them below its metric table, and ``report --compare`` on a page per dataset
(caption_table); the images listed first are those whose score differs most between the two sides (the main
metric's unit, CIDEr, where the experiments have it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from clipcache.tasks.report.compare import paired_experiments
from clipcache.tasks.report.flip_pages import CaptionRow

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

MAIN_UNIT = "caption_cider"  # the captioning task's main metric (CIDEr), the order of the images shown


@dataclass(frozen=True)
class CaptionPair:
    """One image as two captioning experiments saw it."""

    dataset: str
    metric: str  # the per-image score below (CIDEr, ROUGE_L, clipscore, ...)
    sample_index: int
    sample_key: str | None
    baseline_caption: str
    candidate_caption: str
    reference_captions: list[str]
    baseline_value: float
    candidate_value: float

    @property
    def difference(self) -> float:
        return self.candidate_value - self.baseline_value

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "difference": self.difference}


@dataclass(frozen=True)
class CaptionTable:
    """The rows of a captioning compare page (tasks/report/flip_pages.py CaptionPage)."""

    metrics: list[str]  # the per-image scores, the one that orders the rows first
    rows: list[CaptionRow]
    n_images: int  # images both sides captioned (``rows`` holds the first ``limit`` of them)
    means: tuple[float, float]  # A's and B's mean of metrics[0] over all the images


def _unit(con: DuckDBPyConnection, baseline: str, candidate: str) -> str | None:
    """The unit to order the images by: the main metric's where both experiments have its rows, else the first
    unit (by name) they share."""
    units = [u for (u,) in con.execute("SELECT DISTINCT unit FROM caption_pairs(?, ?) ORDER BY unit",
                                       [baseline, candidate]).fetchall()]
    return MAIN_UNIT if MAIN_UNIT in units else (units[0] if units else None)


def caption_pairs(con: DuckDBPyConnection, baseline: str, candidate: str, *, limit: int | None = None) -> list[CaptionPair]:
    """Per captioning dataset the two selections share (tasks/report/compare.py pairs them): up to ``limit`` images
    with both captions, the images whose scores differ most first (ties: dataset order). Empty where the pairs are
    not captioning experiments or their rows hold no captions (written before the caption columns existed)."""
    names = _metric_names()
    found: list[CaptionPair] = []
    for a, b in paired_experiments(con, baseline, candidate):
        if a["task"] != "captioning":
            continue
        unit = _unit(con, a["experiment_id"], b["experiment_id"])
        if unit is None:
            continue
        rows = con.execute(
            "SELECT sample_index, sample_key, baseline_caption, candidate_caption, reference_captions, "
            "baseline_value, candidate_value FROM caption_pairs(?, ?) WHERE unit = ? "
            "ORDER BY abs(candidate_value - baseline_value) DESC, sample_index"
            + (" LIMIT ?" if limit is not None else ""),
            [a["experiment_id"], b["experiment_id"], unit, *([limit] if limit is not None else [])]).fetchall()
        metric = names.get(unit, unit.removeprefix("caption_"))
        found += [CaptionPair(a["dataset"], metric, int(i), key, ca, cb, list(refs or []), float(va), float(vb))
                  for i, key, ca, cb, refs, va, vb in rows]
    return found


def caption_table(con: DuckDBPyConnection, baseline_id: str, candidate_id: str, *, limit: int) -> CaptionTable | None:
    """Two captioning experiments' rows for the report's compare page: every per-image score both keep (the main
    metric's first), up to ``limit`` images with both captions and their references, those whose first score differs
    most first (ties: dataset order). None where the rows hold no captions (written before the caption columns)."""
    first = _unit(con, baseline_id, candidate_id)
    if first is None:
        return None
    names = _metric_names()
    found = con.execute("SELECT unit, sample_index, baseline_caption, candidate_caption, reference_captions, "
                        "baseline_value, candidate_value FROM caption_pairs(?, ?)",
                        [baseline_id, candidate_id]).fetchall()
    units = sorted({u for u, *_ in found}, key=lambda u: (u != first, u))
    images: dict[int, CaptionRow] = {}
    for unit, i, ca, cb, refs, va, vb in found:
        row = images.setdefault(int(i), CaptionRow(int(i), ca, cb, references=list(refs or [])))
        metric = names.get(unit, unit.removeprefix("caption_"))
        row.a_scores[metric], row.b_scores[metric] = float(va), float(vb)
    main = names.get(first, first.removeprefix("caption_"))
    scored = [r for r in images.values() if main in r.a_scores]
    means = (sum(r.a_scores[main] for r in scored) / len(scored), sum(r.b_scores[main] for r in scored) / len(scored))
    ordered = sorted(images.values(), key=lambda r: (-abs(r.b_scores.get(main, 0.0) - r.a_scores.get(main, 0.0)),
                                                     r.sample_index))
    return CaptionTable([names.get(u, u.removeprefix("caption_")) for u in units], ordered[:limit], len(images), means)


def _metric_names() -> dict[str, str]:
    """unit -> the metric's name as the metrics table spells it (caption_cider -> CIDEr)."""
    from clipcache.tasks.score.caption_metrics import MEAN_OF_IMAGES
    from clipcache.tasks.score.caption_scoring import unit_name

    return {unit_name(m): m for m in (*MEAN_OF_IMAGES, "Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR")}
