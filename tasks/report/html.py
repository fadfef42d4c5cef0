"""A static, self-contained HTML report from the dbt marts: one file, inline SVG charts, no scripts, no network."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from clipcache.storage.atomic import atomic_write_text

PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px 40px;color:#1f2328;background:#fff}
h1{font-size:24px;margin:0 0 4px} h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.muted{color:#656d76} table{border-collapse:collapse;margin:8px 0}
th,td{border:1px solid #d0d7de;padding:4px 10px;text-align:left} th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.regressed td{background:#ffebe9} tr.improved td{background:#dafbe1}
span.ci{white-space:nowrap} svg.ci{vertical-align:middle;margin-left:6px}
.charts{display:flex;flex-wrap:wrap;gap:24px} figure{margin:0} figcaption{font-weight:600;margin-bottom:4px}
"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if isinstance(value, datetime) else _e(value)


def _num(value, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _table(headers: list[str], rows: list[list[str]], numeric: set[int], row_classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if j in numeric else f"<td>{c}</td>" for j, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


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


def _interval_text(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f'<span class="ci">{low:.4f}–{high:.4f}</span>'


def _value_with_interval(value: float | None, low: float | None, high: float | None,
                         scale: tuple[float, float]) -> str:
    """The value, and where it has a 95% interval, a whisker on the dataset's axis (the numbers in its tooltip)."""
    if value is None or low is None or high is None:
        return _num(value)
    width, height = 90, 12
    lo, hi = scale

    def x(v: float) -> float:
        return 2 + (min(max(v, lo), hi) - lo) / ((hi - lo) or 1.0) * (width - 4)

    tip = f"{value:.4f}, 95% interval {low:.4f}–{high:.4f}"
    bar = (f'<svg class="ci" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="95% interval {low:.4f} to {high:.4f}"><title>{tip}</title>'
           f'<line x1="0" y1="{height / 2}" x2="{width}" y2="{height / 2}" stroke="#eaeef2"/>'
           f'<rect x="{x(low):.1f}" y="3" width="{max(x(high) - x(low), 1):.1f}" height="{height - 6}" '
           f'fill="#9ecae1"/>'
           f'<line x1="{x(low):.1f}" y1="1" x2="{x(low):.1f}" y2="{height - 1}" stroke="#2166ac"/>'
           f'<line x1="{x(high):.1f}" y1="1" x2="{x(high):.1f}" y2="{height - 1}" stroke="#2166ac"/>'
           f'<circle cx="{x(value):.1f}" cy="{height / 2}" r="2.5" fill="#08306b"/></svg>')
    return f'<span class="ci" title="{tip}">{_num(value)} {bar}</span>'


def _colour(value: float | None) -> str:
    """White (0) to blue (1)."""
    if value is None:
        return "#eeeeee"
    v = max(0.0, min(1.0, value))
    r, g, b = (int(255 - v * (255 - c)) for c in (33, 102, 172))
    return f"rgb({r},{g},{b})"


def heatmap_svg(models: list[str], datasets: list[str], values: dict[tuple[str, str], float]) -> str:
    cell_w, cell_h, left, top = 120, 34, 220, 130
    width, height = left + cell_w * len(datasets) + 20, top + cell_h * len(models) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="model by dataset heatmap">']
    for j, d in enumerate(datasets):
        x = left + j * cell_w + cell_w / 2
        parts.append(f'<text x="{x - 20}" y="{top - 8}" transform="rotate(-30 {x - 20} {top - 8})" '
                     f'font-size="12">{_e(d)}</text>')
    for i, m in enumerate(models):
        y = top + i * cell_h
        parts.append(f'<text x="{left - 8}" y="{y + cell_h / 2 + 4}" text-anchor="end" font-size="12">{_e(m)}</text>')
        for j, d in enumerate(datasets):
            v = values.get((m, d))
            x = left + j * cell_w
            parts.append(f'<rect x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" fill="{_colour(v)}">'
                         f'<title>{_e(m)} / {_e(d)}: {_num(v)}</title></rect>')
            ink = "#fff" if v is not None and v > 0.6 else "#1f2328"
            parts.append(f'<text x="{x + cell_w / 2}" y="{y + cell_h / 2 + 4}" text-anchor="middle" font-size="12" '
                         f'fill="{ink}">{_num(v, 3)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def curve_svg(series: dict[str, list[tuple[int, float]]]) -> str:
    """recall@k against k (log-spaced x when k spans a wide range), one polyline per series."""
    import math

    width, height, left, bottom, top, right = 560, 260, 48, 36, 12, 250
    ks = sorted({k for points in series.values() for k, _ in points})
    if not ks:
        return ""
    log = ks[-1] / max(ks[0], 1) > 8

    def xpos(k: int) -> float:
        lo, hi = (math.log(ks[0]), math.log(ks[-1])) if log else (ks[0], ks[-1])
        v = math.log(k) if log else k
        return left + (0.5 if hi == lo else (v - lo) / (hi - lo)) * (width - left - right)

    def ypos(v: float) -> float:
        return top + (1 - v) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="recall at k">',
             f'<line x1="{left}" y1="{ypos(0)}" x2="{width - right}" y2="{ypos(0)}" stroke="#888"/>',
             f'<line x1="{left}" y1="{ypos(0)}" x2="{left}" y2="{ypos(1)}" stroke="#888"/>']
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<text x="{left - 6}" y="{ypos(tick) + 4}" text-anchor="end" font-size="11">{tick:.2f}</text>'
                     f'<line x1="{left}" y1="{ypos(tick)}" x2="{width - right}" y2="{ypos(tick)}" stroke="#eee"/>')
    for k in ks:
        parts.append(f'<text x="{xpos(k)}" y="{height - bottom + 16}" text-anchor="middle" font-size="11">{k}</text>')
    parts.append(f'<text x="{(left + width - right) / 2}" y="{height - 4}" text-anchor="middle" font-size="11">k'
                 f'</text>')
    for n, (name, points) in enumerate(sorted(series.items())):
        colour = PALETTE[n % len(PALETTE)]
        pts = " ".join(f"{xpos(k):.1f},{ypos(v):.1f}" for k, v in sorted(points))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for k, v in points:
            parts.append(f'<circle cx="{xpos(k):.1f}" cy="{ypos(v):.1f}" r="3" fill="{colour}">'
                         f'<title>{_e(name)} recall@{k} = {v:.4f}</title></circle>')
        parts.append(f'<rect x="{width - right + 10}" y="{top + n * 18}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{width - right + 26}" y="{top + n * 18 + 10}" font-size="11">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


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


def _suite_table(rows: list[tuple]) -> str:
    """A complete suite's score, or 'partial: k of n' and what is missing: a partial mean is never shown bare."""
    body = []
    for (suite, label, complete, present, total, score, normalized, partial, missing, rank, lo, hi, nlo, nhi,
         not_separable, why) in rows:
        if complete:
            score_cell = f'<span class="score">{_num(score)}</span>'
        else:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            score_cell = (f'<span class="partial">partial: {present} of {total}</span> <span class="muted">'
                          f'(missing: {_e(shown)}; mean of the {present} present: {_num(partial)}, not a suite '
                          f'score)</span>')
        interval = _interval_text(lo, hi) or (f'<span class="muted" title="{_e(why)}">no interval</span>'
                                              if complete else "")
        cells = [_e(suite), "" if rank is None else str(rank), _e(label), score_cell, interval,
                 f'<span class="normalized">{_num(normalized)}</span>' if complete else "",
                 _interval_text(nlo, nhi), f"{present}/{total}", _e(", ".join(not_separable or []))]
        row = "".join(f'<td class="num">{c}</td>' if j in (1, 4, 5, 6, 7) else f"<td>{c}</td>"
                      for j, c in enumerate(cells))
        body.append(f'<tr data-suite="{_e(suite)}" data-model="{_e(label)}">{row}</tr>')
    head = "".join(f"<th>{h}</th>" for h in ("suite", "rank", "model", "score", "95% interval", "normalised",
                                             "95% interval", "datasets", "not separable from (5%)"))
    return f'<table id="suites"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


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

    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    sections = [
        f"<h1>clipcache report</h1><p class='muted'>{len(models)} models, {len(datasets)} datasets, latest run per "
        f"model × dataset · generated {now} · {n_regressed} regression(s) flagged</p>",
        "<h2>Models (macro average of each dataset's main metric)</h2>",
        _table(["model", "pretrained", "task", "datasets", "macro average", "newest result"],
               [[_e(m), _e(p), _e(k), str(n), _num(v), _when(t)] for m, p, k, n, v, t in summary], {3, 4}),
        "<h2>Leaderboard</h2><p class='muted'>Latest complete run on the full data with the dataset's own prompts, "
        "per model checkpoint. Main metric: acc1 for classification (mAP for multilabel), mean of text→image and "
        "image→text recall@5 for retrieval, nDCG@10 for text retrieval.</p>",
        _table(["model", "dataset", "task", "main metric", "value", "95% interval", "n", "run", "created"],
               [[_e(m), _e(d), _e(t), _e(mm), _value_with_interval(v, lo, hi, scales[d, t]), _interval_text(lo, hi),
                 _e(n), _e(r), _when(c)] for m, d, t, mm, v, n, r, c, lo, hi in board], {4, 5, 6}),
        "<h2>Suites</h2><p class='muted'>Mean of each dataset's main metric over every dataset of the suite "
        "(normalised: of (value − chance) / (1 − chance)); a model missing a dataset is partial and has no score. "
        "Intervals: 95% bootstrap over the per-sample rows; rank among the complete models, with those whose "
        "order is not separable at 5% (`clipcache suite score`).</p>",
        _suite_table(suites) if suites else "<p class='muted'>No model has a result on a dataset of a suite.</p>",
        "<h2>Model × dataset</h2>", heatmap_svg(models, datasets, heat) if board else "<p>No results yet.</p>",
        "<h2>Retrieval recall@k</h2>",
        "<div class='charts'>" + "".join(f"<figure><figcaption>{_e(d)}</figcaption>{curve_svg(s)}</figure>"
                                         for d, s in sorted(by_dataset.items())) + "</div>"
        if by_dataset else "<p>No retrieval results.</p>",
        "<h2>History: change against the previous run</h2><p class='muted'>Red: worse by more than the threshold "
        "in the metric's own direction; green: better.</p>",
        _table(["created", "model", "dataset", "metric", "k", "previous", "value", "change", "flag"],
               [[_when(c), _e(m), _e(d), _e(mt), _e(k), _num(p), _num(v), _num(dl, 4),
                 "regressed" if rg else "improved" if im else ""]
                for c, m, d, mt, k, p, v, dl, rg, im in history], {4, 5, 6, 7},
               ["regressed" if r[8] else "improved" if r[9] else "" for r in history])
        if history else "<p class='muted'>No metric has been measured twice yet.</p>",
    ]
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>clipcache report</title>"
            f"<style>{CSS}</style></head><body>{''.join(sections)}</body></html>")
    atomic_write_text(out, page)  # a reader (or an interrupted run) sees the old page or the new one, whole
    return out
