"""Two captioning experiments image by image: each image's two captions, its references and each side's per-image
score, read from the warehouse's sample rows (the ``caption_pairs`` macro, storage/warehouse.py).

``clipcache compare`` shows them below its metric table; the images listed first are those whose score differs most
between the two sides (the main metric's unit, CIDEr, where the experiments have it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from clipcache.tasks.report.compare import paired_experiments

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


def _unit(con: Any, baseline: str, candidate: str) -> str | None:
    """The unit to order the images by: the main metric's where both experiments have its rows, else the first
    unit (by name) they share."""
    units = [u for (u,) in con.execute("SELECT DISTINCT unit FROM caption_pairs(?, ?) ORDER BY unit",
                                       [baseline, candidate]).fetchall()]
    return MAIN_UNIT if MAIN_UNIT in units else (units[0] if units else None)


def caption_pairs(con: Any, baseline: str, candidate: str, *, limit: int | None = None) -> list[CaptionPair]:
    """Per captioning dataset the two selections share (tasks/report/compare.py pairs them): up to ``limit`` images
    with both captions, the images whose scores differ most first (ties: dataset order). Empty where the pairs are
    not captioning experiments or their rows hold no captions (written before the caption columns existed)."""
    from clipcache.tasks.score.caption_metrics import MEAN_OF_IMAGES
    from clipcache.tasks.score.caption_scoring import unit_name

    names = {unit_name(m): m for m in (*MEAN_OF_IMAGES, "Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR")}
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
