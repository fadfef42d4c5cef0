"""DataComp's group-metadata sets read in their ORIGINAL published layouts, giving the same metadata codes (and the
same class indices) as DataComp's webdataset copies, so that group metrics do not depend on the layout a user has.
How each set's files become DataComp's vector is data: the ``original`` entry of group_layouts.json.

- FMoW, WILDS' folder ``fmow_v1.1/`` (``rgb_metadata.csv``, ``country_code_mapping.csv``, ``images/rgb_img_<i>.png``),
  as WILDS' ``FMoWDataset`` builds it: the region is the country code's ``region`` in the mapping (``alpha-3`` ->
  ``region``; a code not in it is "Other"), numbered in order of first appearance over every row of the CSV
  (``unique()``, before the sequestered rows are dropped); the year is the UTC timestamp's year - 2002 (2002-2017);
  the class is the index of ``category`` in WILDS' category list; the image of CSV row i is ``rgb_img_<i>.png``.
  Splits are WILDS' ``time_after_2016``: ``test`` = split ``test`` from 2016 on, ``val`` = split ``val`` in
  2013-2015, ``id_test`` / ``id_val`` / ``train`` = those splits before 2013. DataComp's copy holds WILDS'
  ``metadata_array`` (its fields are WILDS' ``region, year, y``), so the codes are the same.
- GeoDE (``index.csv``: file_path, object, region, ip_country): the class is the line of ``classnames.txt`` naming
  ``object``; region is its index in the list of GeoDE's six regions in alphabetical order, country its rank among
  the file's countries in alphabetical order (pandas' category codes). DataComp published no script that builds its
  copy: alphabetical codes are an assumption, stated in group_layouts.json where they can be changed.
- Dollar Street (MLCommons release: ``images_v2_imagenet_test.csv`` / ``_train.csv``, images at ``imageRelPath``):
  the class is the first entry of ``topics`` that ``classnames.txt`` names; region is ``region.id`` (af, am, as,
  eu, alphabetical); ``income_meta`` is the income quartile of Richards et al.'s Dollar Street evaluation (monthly
  income <= 195, <= 685, <= 1963, above; 0 = poorest) and ``income_ds`` Dollar Street's four income levels
  (Gapminder's $2 / $8 / $32 a day, as monthly incomes; 0 = poorest). DataComp's derivation of its three fields is
  not public: these are documented groupings of the same column, not a verified reproduction of its codes.
- FairFace (``fairface_label_val.csv`` / ``_train.csv``: file, age, gender, race, service_test; ``test`` reads the
  val labels, the set DataComp evaluates): codes in the orders of DataComp's ``fairness_tables.py`` (race: Black,
  White, Indian, Latino, Middle Eastern, Southeast Asian, East Asian; gender: Male, Female; race_binary 0 = White)
  and FairFace's nine age ranges in increasing order.
- UTKFace (``UTKFace/[age]_[gender]_[race]_[date&time].jpg``, also ``.jpg.chip.jpg``, sorted by name): age binned
  into FairFace's ranges, gender as UTKFace's (0 male), race re-numbered to DataComp's UTKFace order (Black, White,
  Indian, Asian, Other; UTKFace's own is White, Black, Asian, Indian, Others). The public release has a few files
  without a race; they are refused like any malformed name (rename or remove them).

CSV files are read as text (``csv``), never evaluated: a list cell such as ``['toothbrush']`` is read by a regular
expression that accepts a bracketed list of quoted names and nothing else (tasks/datasets/text_cells.py). A row the rules cannot read (a region outside the list, a
category that is not a class, a timestamp outside WILDS' years, a missing image, an image path leaving the folder,
a malformed file name) is one DatasetError naming the file and the row. Prompts are not in any of these releases:
``classnames.txt`` and ``zeroshot_classification_templates.txt`` (DataComp's) must be in ``--dataset_root``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.base import ClassPrompts
from clipcache.tasks.datasets.text_cells import quoted_list

Row = dict[str, str]


@dataclass
class OriginalRows:
    """The rows of one split: each one's image, its class (or -1), its codes and where it was declared."""

    images: list[Path] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    codes: list[list[int]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)


def original_folder(spec: dict[str, Any], root: Path) -> Path | None:
    """The first of the spec's candidate folders under ``root`` that holds its table (or files), else None."""
    for name in spec["folder"]:
        folder = (root / name) if name != "." else root
        if "files" in spec:
            if folder.is_dir() and any(_file_rows(spec, folder, strict=False)):
                return folder
        elif (folder / _table(spec, "test" if "tables" in spec else None)).is_file():
            return folder
    return None


def _table(spec: dict[str, Any], split: str | None) -> str:
    if "tables" in spec:
        return str(spec["tables"].get(split or "test", ""))
    return str(spec["table"])


def _norm(text: str) -> str:
    """How a value is matched to a declared name: case, spaces, ``_`` and ``-`` ignored."""
    return re.sub(r"[\s_\-]+", "", text).lower()


def _csv_rows(path: Path) -> list[tuple[str, Row]]:
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames:
                raise DatasetError(f"{path}: no header row")
            return [(f"{path} line {reader.line_num}", {k: (v or "").strip() for k, v in row.items() if k})
                    for row in reader]
    except OSError as e:
        raise DatasetError(f"cannot read {path} ({e.strerror})") from e
    except (csv.Error, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: not a readable UTF-8 CSV file ({e})") from e


def _file_rows(spec: dict[str, Any], folder: Path, *, strict: bool = True) -> Iterator[tuple[str, Row]]:
    """UTKFace: one row per image file, its columns the named groups of the file-name pattern."""
    pattern = re.compile(spec["files"]["pattern"])
    for path in sorted(folder.glob(spec["files"]["glob"])):
        match = pattern.fullmatch(path.name)
        if match is None:
            if not strict:
                continue
            raise DatasetError(f"{path}: file name is not {spec['files']['pattern']!r} "
                               f"([age]_[gender]_[race]_[date&time].jpg); rename or remove it")
        yield str(path), {**match.groupdict(), "_file": path.name}


def _timestamp(value: str, where: str) -> datetime:
    """An ISO 8601 time as pandas' to_datetime reads FMoW's (``Z`` = UTC; no zone: taken as UTC)."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as e:
        raise DatasetError(f"{where}: timestamp {value!r} is not an ISO 8601 date and time") from e
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _utc(year: str | None) -> datetime | None:
    return None if year is None else datetime(int(year), 1, 1, tzinfo=UTC)


def _selected(spec: dict[str, Any], split: str, rows: list[tuple[str, Row]]) -> list[int]:
    """Indices (into ``rows``) of the split's rows, in file order."""
    rule = spec.get("splits", {}).get(split)
    if "splits" in spec and rule is None:
        raise DatasetError(f"split {split!r} is not one of {', '.join(spec['splits'])}")
    if "splits" not in spec and "tables" not in spec and split != "test":
        raise DatasetError(f"split {split!r}: this layout has one split, 'test' (DataComp evaluates all of it)")
    if rule is None:
        return list(range(len(rows)))
    start, end = (_utc(y) for y in rule.get("time", [None, None]))
    chosen = []
    for i, (where, row) in enumerate(rows):
        if any(row.get(c) != v for c, v in rule.get("where", {}).items()):
            continue
        if start is not None or end is not None:
            moment = _timestamp(row.get(spec["time_column"], ""), where)
            if (start is not None and moment < start) or (end is not None and moment >= end):
                continue
        chosen.append(i)
    return chosen


def _column(row: Row, column: str, where: str) -> str:
    if column not in row:
        raise DatasetError(f"{where}: no column {column!r}")
    return row[column]


def _lookup(spec: dict[str, Any], folder: Path) -> dict[str, str]:
    rows = _csv_rows(folder / spec["file"])
    return {row[spec["key"]]: row[spec["value"]] for where, row in rows if spec["key"] in row and spec["value"] in row}


class _FieldCodes:
    """One field's rule from group_layouts.json, ready to code rows (tables built once from the whole file)."""

    def __init__(self, name: str, rule: dict[str, Any], folder: Path, rows: list[tuple[str, Row]]):
        self.name, self.rule = name, rule
        self.table: dict[str, int] | None = None
        self.mapping: dict[str, str] | None = None
        if "lookup" in rule:
            self.mapping = _lookup(rule["lookup"], folder)
        if isinstance(rule.get("codes"), list):
            self.table = {_norm(v): i for i, v in enumerate(rule["codes"])}
        elif rule.get("codes") in ("sorted", "first_seen"):
            values = [self._value(row, where) for where, row in rows]
            order = sorted(set(values)) if rule["codes"] == "sorted" else list(dict.fromkeys(values))
            self.table = {v: i for i, v in enumerate(order)}

    def _value(self, row: Row, where: str) -> str:
        value = _column(row, self.rule["column"], where)
        if self.mapping is not None:
            value = self.mapping.get(value, self.rule["lookup"]["default"])
        return value if self.rule.get("codes") == "first_seen" else _norm(value)

    def code(self, row: Row, where: str) -> int:
        rule = self.rule
        if "years" in rule:
            first, last = rule["years"]
            year = _timestamp(_column(row, rule["column"], where), where).year
            if not first <= year <= last:
                raise DatasetError(f"{where}: {rule['column']} year {year} is outside WILDS' years {first}-{last}")
            return year - first
        if "bins" in rule:
            raw = _column(row, rule["column"], where)
            try:
                number = float(raw)
            except ValueError as e:
                raise DatasetError(f"{where}: {rule['column']} {raw!r} is not a number") from e
            return sum(number > edge for edge in rule["bins"])  # right-closed bins: an edge belongs below
        if "map" in rule:
            raw = _column(row, rule["column"], where)
            if raw not in rule["map"]:
                raise DatasetError(f"{where}: {rule['column']} {raw!r} is not one of {', '.join(rule['map'])}")
            return int(rule["map"][raw])
        value = self._value(row, where)
        if self.table is None or value not in self.table:
            known = ", ".join(rule["codes"]) if isinstance(rule.get("codes"), list) else "the file's values"
            raise DatasetError(f"{where}: {self.name} {_column(row, rule['column'], where)!r} is not one of {known}")
        return self.table[value]


def _class_index(spec: dict[str, Any], row: Row, where: str, prompts: ClassPrompts | None) -> int:
    rule = spec.get("label")
    if rule is None:
        return -1
    raw = _column(row, rule["column"], where)
    candidates = [raw]
    if raw.startswith("["):  # a list cell (Dollar Street's topics): literals only, never code
        names = quoted_list(raw)
        if names is None:
            raise DatasetError(f"{where}: {rule['column']} {raw!r} is not a list of quoted names")
        candidates = names
    names = rule["classes"] if rule["classes"] != "classnames" else (prompts.classnames if prompts else [])
    index = {_norm(n): i for i, n in enumerate(names)}
    found = next((index[_norm(c)] for c in candidates if _norm(c) in index), None)
    if found is None:
        source = "classnames.txt" if rule["classes"] == "classnames" else "the dataset's classes"
        raise DatasetError(f"{where}: {rule['column']} {raw!r} is not a class of {source}")
    return found


def _image(spec: dict[str, Any], folder: Path, row: Row, row_index: int, where: str) -> Path:
    try:
        relative = spec["image"].format(**row, _row=row_index)
    except (KeyError, IndexError, ValueError) as e:
        raise DatasetError(f"{where}: cannot name the image ({spec['image']!r}: {e})") from e
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts:
        raise DatasetError(f"{where}: image {relative!r} is not a path inside {folder}")
    path = folder / relative
    if not path.is_file():
        raise DatasetError(f"{where}: image {path} is missing")
    return path


def read_original(spec: dict[str, Any], fields: tuple[str, ...], folder: Path, split: str, limit: int | None,
                  prompts: ClassPrompts | None) -> OriginalRows:
    """The split's rows of the original layout under ``folder``, coded by ``spec`` (group_layouts.json)."""
    if "files" in spec:
        rows = list(_file_rows(spec, folder))
        if not rows:
            raise DatasetError(f"{folder}: no image named as {spec['files']['pattern']!r}")
    else:
        table = _table(spec, split)
        if not table:
            raise DatasetError(f"split {split!r} is not one of {', '.join(spec['tables'])}")
        rows = _csv_rows(folder / table)
    rules = spec["fields"]
    coders = {f: _FieldCodes(f, rules[f], folder, rows) for f in fields if "column" in rules[f]}
    out = OriginalRows()
    for i in _selected(spec, split, rows):
        if limit is not None and len(out.images) >= limit:
            break
        where, row = rows[i]
        label = _class_index(spec, row, where, prompts)
        values: dict[str, int] = {}
        for f in fields:
            rule = rules[f]
            if rule.get("label"):
                values[f] = label
            elif "from" in rule:
                values[f] = int(values[rule["from"]] != rule["not_equal"])
            else:
                values[f] = coders[f].code(row, where)
        out.images.append(_image(spec, folder, row, i, where))
        out.labels.append(label)
        out.codes.append([values[f] for f in fields])
        out.origins.append(where)
    if not out.images:
        raise DatasetError(f"{folder}: no row of split {split!r}")
    return out
