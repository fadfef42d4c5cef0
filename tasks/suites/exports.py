"""Suite results in the formats the community compares in, and the check of a published table against ours.

- ``openclip``: open_clip's ``docs/openclip_results.csv`` columns: ``name, pretrained, Average perf. on N datasets``,
  then one column per suite dataset by its display name, holding the main metric (the average only for a complete
  suite: an empty cell otherwise, never a partial mean under a full-suite header);
- ``openclip_retrieval``: ``docs/openclip_retrieval_results.csv`` columns for the retrieval sets this suite has
  (``Flickr image retr. R@1`` = text -> image recall@1, ``Flickr text retr. R@1`` = image -> text, ...);
- ``datacomp``: DataComp's ``eval_results.jsonl`` for one model: one line per task,
  ``{"key", "dataset", "metrics": {..., "main_metric"}}``.

:func:`check_published` reads a published table (open_clip's CSV, or a user's CSV of paper numbers with the same
``name, pretrained, <dataset>...`` columns; percentages are read as such) and lines it up with our values.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.storage.errors import ConfigError
from clipcache.storage.spreadsheet import csv_writer
from clipcache.tasks.score.intervals import percentile_interval
from clipcache.tasks.suites import Suite, SuiteEntry, read_bounded_text
from clipcache.tasks.suites.scoring import DatasetResult, ModelScore

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

RETRIEVAL_NAMES = {"flickr30k": "Flickr", "mscoco_captions": "MSCOCO"}
MAX_PUBLISHED_BYTES = 20_000_000  # open_clip's openclip_results.csv is ~100 KB


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def openclip_csv(suite: Suite, scores: list[ModelScore]) -> str:
    out = io.StringIO()
    writer = csv_writer(out, lineterminator="\n")
    writer.writerow(["name", "pretrained", f"Average perf. on {len(suite.datasets)} datasets",
                     *[e.label for e in suite.datasets]])
    for s in sorted(scores, key=lambda s: -(s.score if s.score is not None else -1.0)):
        writer.writerow([s.model[0], s.model[1] or "", "" if s.score is None else repr(s.score),
                         *[_cell(r.value) for r in s.results]])
    return out.getvalue()


def openclip_retrieval_csv(con: DuckDBPyConnection, suite: Suite, scores: list[ModelScore]) -> str:
    sets = [e for e in suite.datasets if e.dataset in RETRIEVAL_NAMES]
    if not sets:
        raise ConfigError(f"--format openclip_retrieval: suite {suite.name} has none of "
                          f"{', '.join(RETRIEVAL_NAMES)}")
    columns = [(e, direction, k) for e in sets for direction in ("image", "text") for k in (1, 5, 10)]
    out = io.StringIO()
    writer = csv_writer(out, lineterminator="\n")
    writer.writerow(["name", "pretrained", "Average score",
                     *[f"{RETRIEVAL_NAMES[e.dataset]} {d} retr. R@{k}" for e, d, k in columns]])
    for s in scores:
        values = []
        for e, direction, k in columns:
            row = con.execute(
                "SELECT value FROM leaderboard WHERE model = ? AND pretrained IS NOT DISTINCT FROM ? AND checkpoint "
                "IS NOT DISTINCT FROM ? AND dataset = ? AND split = ? AND language = ? AND metric = ? AND k = ?",
                [s.model[0], s.model[1], s.model[2], e.dataset, e.split, e.language,
                 f"{direction}_retrieval_recall", k]).fetchone()
            values.append(None if row is None else float(row[0]))
        if all(v is None for v in values):
            continue
        average = None if any(v is None for v in values) else float(np.mean([v for v in values if v is not None]))
        writer.writerow([s.model[0], s.model[1] or "", _cell(average), *[_cell(v) for v in values]])
    return out.getvalue()


def datacomp_jsonl(con: DuckDBPyConnection, score: ModelScore) -> str:
    """DataComp's eval_results.jsonl of one model: every metric of each present dataset, and its main metric."""
    lines = []
    for r in score.present:
        rows = con.execute("SELECT metric, k, value FROM leaderboard WHERE experiment_id = ?",
                           [r.experiment_id]).fetchall()
        metrics: dict[str, Any] = {}
        for metric, k, value in rows:
            name = metric if k is None else (f"{metric}{k}" if metric == "acc" else f"{metric}@{k}")
            metrics[name] = value
        if r.entry.main_metric.startswith("mean_recall@"):
            metrics[r.entry.main_metric] = r.value
        metrics["main_metric"] = r.value
        lines.append(json.dumps({"key": r.entry.source_key or r.entry.dataset, "dataset": r.entry.label,
                                 "metrics": metrics}))
    return "\n".join(lines) + ("\n" if lines else "")


@dataclass
class Reproduction:
    model: str
    pretrained: str | None
    dataset: str
    ours: float | None
    published: float
    ci_low: float | None
    ci_high: float | None

    @property
    def difference(self) -> float | None:
        return None if self.ours is None else self.ours - self.published

    @property
    def verdict(self) -> str:
        if self.ours is None:
            return "not run here"
        if self.ci_low is None or self.ci_high is None:
            return "no interval"
        return "outside our interval" if not self.ci_low <= self.published <= self.ci_high else "within"


PUBLISHED = Path(__file__).parent / "published"


def published_table(name_or_path: str | Path) -> Path:
    """A CSV path, or the name of a table shipped with clipcache (tasks/suites/published/<name>.csv: ``internvl``,
    the InternVL-C / InternVL-G numbers of InternVL's clip_benchmark README)."""
    path = Path(name_or_path)
    shipped = PUBLISHED / f"{name_or_path}.csv"
    return shipped if not path.exists() and path.suffix == "" and shipped.is_file() else path


def read_published(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    path = published_table(path)
    text = read_bounded_text(path, MAX_PUBLISHED_BYTES, "--published:", encoding="utf-8-sig")
    reader = csv.DictReader(io.StringIO(text))
    header = list(reader.fieldnames or [])
    if "name" not in header:
        raise ConfigError(f"--published: {path} has no 'name' column (open_clip's layout: name, pretrained, then "
                          f"one column per dataset)")
    return header, list(reader)


def _column_entries(suite: Suite, header: list[str]) -> dict[str, SuiteEntry]:
    by_name = {e.label: e for e in suite.datasets} | {e.dataset: e for e in suite.datasets} | {
        e.source_key: e for e in suite.datasets if e.source_key}
    return {column: by_name[column] for column in header if column in by_name}


def _interval(result: DatasetResult) -> tuple[float | None, float | None]:
    return percentile_interval(result.draws) if result.draws is not None else (None, None)


def check_published(suite: Suite, scores: list[ModelScore], path: Path) -> list[Reproduction]:
    """Per published row whose (name, pretrained) is one of our models and per dataset column of the suite: our
    value, the published one, and our 95% interval of it."""
    header, rows = read_published(path)
    columns = _column_entries(suite, header)
    if not columns:
        raise ConfigError(f"--published: no column of {path} names a dataset of suite {suite.name} (by display "
                          f"name, e.g. {suite.datasets[0].label!r}, or dataset name)")
    values: list[tuple[dict[str, str], str, float]] = []
    for row in rows:
        for column in columns:
            cell = (row.get(column) or "").strip()
            if not cell:
                continue
            try:
                values.append((row, column, float(cell.rstrip("%"))))
            except ValueError:
                raise ConfigError(f"--published: {path}: {column} of {row.get('name')} is {cell!r}, not a "
                                  f"number") from None
    percent = any(v > 1.0 for _, _, v in values)  # a table in percent: every value is read as percent
    # A published row names a checkpoint as its authors do; ours may carry a content-hash suffix ("<folder>@<hash>":
    # a model folder), so a row's pretrained matches our label with or without it.
    ours: dict[tuple[str, str], list[ModelScore]] = {}
    for s in scores:
        label = s.model[1] or ""
        for pretrained in dict.fromkeys((label, label.rsplit("@", 1)[0])):
            ours.setdefault((s.model[0], pretrained), []).append(s)
    out = []
    for row, column, value in values:
        key = (row["name"].strip(), (row.get("pretrained") or "").strip())
        for score in ours.get(key, []):
            entry = columns[column]
            result = next(r for r in score.results if r.entry is entry)
            low, high = _interval(result)
            out.append(Reproduction(score.model[0], score.model[1] or None, entry.dataset, result.value,
                                    value / 100 if percent else value, low, high))
    return out
