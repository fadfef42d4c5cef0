"""A static, self-contained HTML report from the dbt marts: one file, inline SVG charts, no scripts, no network.

This module reads the marts and computes what the charts draw (axes, positions); the markup is the Jinja2 templates
tasks/report/templates/report.html.j2, _suites.html.j2 and _charts.html.j2, with autoescaping."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from clipcache.storage.atomic import atomic_write_text

PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]


def interval_scales(rows: list[tuple[str, str, float | None, float | None, float | None]]
                    ) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (dataset, task): the axis of its interval bars, spanning every value and interval of that column (with a
    margin), so the bars of one dataset can be compared with each other; metrics are fractions, so within [0, 1]."""
    spans: dict[tuple[str, str], list[float]] = {}
    for dataset, task, value, low, high in rows:
        spans.setdefault((dataset, task), []).extend(x for x in (value, low, high) if x is not None)
    scales: dict[tuple[str, str], tuple[float, float]] = {}
    for key, xs in spans.items():
        lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
        pad = max((hi - lo) * 0.1, 0.005)
        scales[key] = (max(0.0, lo - pad), min(1.0, hi + pad)) if hi <= 1 and lo >= 0 else (lo - pad, hi + pad)
    return scales


def interval_bar(value: float | None, low: float | None, high: float | None,
                 scale: tuple[float, float]) -> dict[str, float] | None:
    """Where a value's 95% interval whisker is drawn on its dataset's axis (``scale``); None without an interval."""
    if value is None or low is None or high is None:
        return None
    width, height = 90, 12
    lo, hi = scale

    def x(v: float) -> float:
        return 2 + (min(max(v, lo), hi) - lo) / ((hi - lo) or 1.0) * (width - 4)

    return {"width": width, "height": height, "low": x(low), "high": x(high), "value": x(value)}


def curve_plot(series: dict[str, list[tuple[int, float]]]) -> dict[str, Any] | None:
    """recall@k against k (log-spaced x when k spans a wide range), one polyline per series: the positions the
    template (_charts.html.j2 ``curve``) draws; None without points."""
    import math

    width, height, left, bottom, top, right = 560, 260, 48, 36, 12, 250
    ks = sorted({k for points in series.values() for k, _ in points})
    if not ks:
        return None
    log = ks[-1] / max(ks[0], 1) > 8

    def xpos(k: int) -> float:
        lo, hi = (math.log(ks[0]), math.log(ks[-1])) if log else (ks[0], ks[-1])
        v = math.log(k) if log else k
        return left + (0.5 if hi == lo else (v - lo) / (hi - lo)) * (width - left - right)

    def ypos(v: float) -> float:
        return top + (1 - v) * (height - top - bottom)

    lines = [{"name": name, "colour": PALETTE[n % len(PALETTE)],
              "points": [f"{xpos(k):.1f},{ypos(v):.1f}" for k, v in sorted(points)],
              "markers": [(k, v, xpos(k), ypos(v)) for k, v in points]}
             for n, (name, points) in enumerate(sorted(series.items()))]
    return {"width": width, "height": height, "left": left, "bottom": bottom, "top": top, "right": right,
            "y0": ypos(0), "y1": ypos(1), "ticks": [(t, ypos(t)) for t in (0, 0.25, 0.5, 0.75, 1.0)],
            "ks": [(k, xpos(k)) for k in ks], "series": lines}


def _suite_rows(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """Per suite and model: the suite_scores mart with the intervals and ranks beside it (tasks/report/suites.py);
    complete models first, by rank."""
    if not con.sql("select count(*) from information_schema.tables where table_name = 'suite_intervals'"
                   ).fetchall()[0][0]:
        return []  # a database built before suites had intervals
    return con.sql(
        "select s.suite, s.model_label, s.complete, s.datasets_present, s.datasets, s.score, s.normalized, "
        "s.partial_score, s.missing, i.rank, i.score_ci_low, i.score_ci_high, i.normalized_ci_low, "
        "i.normalized_ci_high, i.not_separable_from, i.no_interval_because "
        "from suite_scores s left join suite_intervals i on i.suite = s.suite and i.model = s.model "
        "and i.pretrained is not distinct from s.pretrained and i.checkpoint is not distinct from s.checkpoint "
        "and i.precision is not distinct from s.precision "
        "order by s.suite, not s.complete, i.rank, s.datasets_present desc, s.model_label").fetchall()


def render_report(database: Path, out: Path, history_rows: int = 200) -> Path:
    con = duckdb.connect(str(database))
    # model_label: the model, its checkpoint label and a non-fp32 precision (two checkpoints are two rows)
    summary = con.sql("select model, pretrained, task, n_datasets, macro_average, newest_result from model_summary "
                      "order by task, macro_average desc nulls last").fetchall()
    # dataset_label: the dataset with a split other than test and a language other than en (one column each)
    board = con.sql("select model_label, dataset_label, task, main_metric, main_value, n_samples, run_id, created_at, "
                    "ci_low, ci_high from leaderboard order by dataset_label, main_value desc nulls last").fetchall()
    curves = con.sql("select model_label, dataset_label, direction, k, value from retrieval_curves "
                     "order by dataset_label, k").fetchall()
    history = con.sql(f"select created_at, model || coalesce(' @ ' || pretrained, ''), dataset, metric, k, "
                      f"previous_value, value, delta, regressed, improved "
                      f"from metric_history where previous_value is not null "
                      f"order by regressed desc, improved desc, created_at desc limit {int(history_rows)}").fetchall()
    n_regressed = con.sql("select count(*) from metric_history where regressed").fetchall()[0][0]
    suites = _suite_rows(con)
    con.close()

    # a dataset evaluated by several tasks (zero-shot, a linear probe, clustering) gets a column per task
    tasks_of: dict[str, set[str]] = {}
    for r in board:
        tasks_of.setdefault(r[1], set()).add(r[2])
    column = {(r[1], r[2]): r[1] if len(tasks_of[r[1]]) == 1 else f"{r[1]} · {r[2]}" for r in board}
    models = sorted({r[0] for r in board})
    datasets = sorted(set(column.values()))
    heat = {(r[0], column[r[1], r[2]]): r[4] for r in board}
    scales = interval_scales([(r[1], r[2], r[4], r[8], r[9]) for r in board])
    by_dataset: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for model, dataset, direction, k, value in curves:
        by_dataset.setdefault(dataset, {}).setdefault(f"{model} · {direction}", []).append((k, value))

    from clipcache.tasks.report.pages import render

    page = render("report.html.j2", now=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), models=models,
                  datasets=datasets, n_regressed=n_regressed, summary=summary, board=board, scales=scales,
                  suites=suites, heat=heat, curves=[(d, curve_plot(s)) for d, s in sorted(by_dataset.items())],
                  history=history, interval_bar=interval_bar)
    atomic_write_text(out, page)  # a reader (or an interrupted run) sees the old page or the new one, whole
    return out
