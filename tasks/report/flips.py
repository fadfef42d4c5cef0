"""The samples two experiments disagree on, read with SQL from the warehouse's ``latest_samples`` rows.

A sample *flips* when its correct@1 differs between the two experiments' latest completed runs: for classification
an image one model classifies right and the other wrong (what ``sample_flips`` and ``clipcache compare`` count), for
retrieval a query whose best-scored item is a right one for one model only. Rows are compared per ``unit`` (an
image; a retrieval's text and image queries are two units), and both sides must hold the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clipcache.storage.errors import ResultsError

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

# how pages list units: text -> image before image -> text, as clip_benchmark reports retrieval; others by name
UNIT_ORDER = ("image", "text_query", "caption", "image_query")
# units whose target is each model's own choice, not the data's: an image query's target is the best-ranked of its
# captions (the two sides may rank different ones first), so only its sample keys tell whether the samples match
MODEL_TARGET_UNITS = ("image_query",)


def _side(name: str, parameter: str) -> str:
    """The sample rows of one experiment's latest completed run: the warehouse's ``latest_samples`` view (dbt's
    ``stg_latest_samples`` model, storage/sql_rules.py), filtered by experiment."""
    return f"{name} AS (SELECT * FROM latest_samples WHERE experiment_id = {parameter})"


@dataclass(frozen=True)
class Flip:
    """One sample that flipped: its target and each side's best-scored classes (or items), best first."""

    sample_index: int
    sample_key: str | None
    target: int | None
    a_top: list[int]
    b_top: list[int]
    a_rank: int | None
    b_rank: int | None


@dataclass
class UnitFlips:
    """Flips of one unit (``image``, ``text_query``, ``image_query``) between experiments A and B."""

    unit: str
    n: int  # samples compared
    a_correct: int  # correct@1 of A
    b_correct: int
    a_only: int  # A right, B wrong
    b_only: int  # B right, A wrong
    shown_a_only: list[Flip] = field(default_factory=list)  # the first ``cap`` of them: the most confident mistakes
    shown_b_only: list[Flip] = field(default_factory=list)


def unit_flips(con: DuckDBPyConnection, a_experiment: str, b_experiment: str, *, cap: int = 50, dataset: str = "") -> list[UnitFlips]:
    """Per unit the two experiments share: the counts of correct@1 and of flips each way, and up to ``cap`` flips
    each way, those where the wrong side was most confident first (its target's margin, lowest first, where rows
    have one; then sample order). Empty when either side has no sample rows; ResultsError when the two cover
    different samples."""
    params = {"a": a_experiment, "b": b_experiment}
    # the units both sides keep one row per sample of, with right or wrong answers (correct1): a text retrieval's
    # relevant_doc rows (several per query), a multilabel class's AP or a clustered image cannot flip
    eligible = ("SELECT unit FROM {0} GROUP BY unit HAVING count(*) = count(DISTINCT sample_index) AND "
                "count(correct1) > 0")
    sides = (f"WITH {_side('a0', '$a')}, {_side('b0', '$b')}, units AS ({eligible.format('a0')} INTERSECT "
             f"{eligible.format('b0')}), a AS (SELECT * FROM a0 SEMI JOIN units USING (unit)), "
             f"b AS (SELECT * FROM b0 SEMI JOIN units USING (unit))")
    sizes = con.execute(f"{sides} SELECT unit, count(*) FILTER (side = 'a'), count(*) FILTER (side = 'b') FROM "
                        f"(SELECT unit, 'a' AS side FROM a UNION ALL SELECT unit, 'b' FROM b) GROUP BY unit ORDER BY "
                        f"unit", params).fetchall()
    counts = con.execute(
        f"{sides} SELECT a.unit, count(*), count(*) FILTER (a.correct1), count(*) FILTER (b.correct1), "
        f"count(*) FILTER (a.correct1 AND NOT b.correct1), count(*) FILTER (b.correct1 AND NOT a.correct1), "
        f"count(*) FILTER ((a.target IS DISTINCT FROM b.target AND NOT list_contains($own_targets, a.unit)) "
        f"OR a.sample_key IS DISTINCT FROM b.sample_key) "
        f"FROM a JOIN b USING (unit, sample_index) GROUP BY a.unit ORDER BY a.unit",
        {**params, "own_targets": list(MODEL_TARGET_UNITS)}).fetchall()
    joined = {row[0]: row for row in counts}
    for unit, n_a, n_b in sizes:
        if n_a == 0 or n_b == 0:
            continue  # one side keeps no rows of this unit (an older release, or a task that does not write them)
        row = joined.get(unit)
        if row is None or not n_a == n_b == row[1] or row[6]:
            raise ResultsError(f"compare: {dataset or a_experiment}: the experiments cover different samples "
                               f"({unit}: {n_a} vs {n_b} rows, or other targets); compare runs over the same data")
    shown = con.execute(
        f"{sides}, flips AS (SELECT a.unit, a.sample_index, a.sample_key, a.target, a.top AS a_top, b.top AS b_top, "
        f"a.rank AS a_rank, b.rank AS b_rank, a.correct1 AS a_right, "
        f"CASE WHEN a.correct1 THEN b.margin ELSE a.margin END AS wrong_margin "
        f"FROM a JOIN b USING (unit, sample_index) WHERE a.correct1 <> b.correct1) "
        f"SELECT unit, a_right, sample_index, sample_key, target, a_top, b_top, a_rank, b_rank FROM flips "
        f"QUALIFY row_number() OVER (PARTITION BY unit, a_right ORDER BY wrong_margin NULLS LAST, sample_index) "
        f"<= $cap ORDER BY unit, a_right DESC, wrong_margin NULLS LAST, sample_index",
        {**params, "cap": int(cap)}).fetchall()
    result = {unit: UnitFlips(unit, n, a_ok, b_ok, a_only, b_only) for unit, n, a_ok, b_ok, a_only, b_only, _
              in counts}
    for unit, a_right, index, key, target, a_top, b_top, a_rank, b_rank in shown:
        flip = Flip(int(index), key, None if target is None else int(target), list(a_top or []), list(b_top or []),
                    a_rank, b_rank)
        (result[unit].shown_a_only if a_right else result[unit].shown_b_only).append(flip)
    return sorted(result.values(), key=lambda u: (UNIT_ORDER.index(u.unit) if u.unit in UNIT_ORDER else
                                                 len(UNIT_ORDER), u.unit))
