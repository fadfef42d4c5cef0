"""Local layouts of composed image retrieval (issue #28: CIRR, FashionIQ; MIEB's CIRRIT2IRetrieval and
FashionIQIT2IRetrieval), and the dataset source that finds them by their files. The task reads them itself
(tasks/evaluation/composed_retrieval.py); docs/mieb.md describes them. Each query is a reference image plus a
modifying text; the documents are the split's images (its gallery). Three layouts:

CIRR's own (github.com/Cuberick-Orion/CIRR; the folder holding ``captions/``, or its parent with ``cirr/``)::

    <root>/captions/cap.rc2.<split>.json        [{"pairid": 1, "reference": "dev-1-0-img0", "target_hard": "...",
                                                  "caption": "...", "img_set": {"id": 36, "members": [six image
                                                  names, the reference among them]}, ...}, ...]
    <root>/image_splits/split.rc2.<split>.json  {"dev-1-0-img0": "./dev/dev-1-0-img0.png", ...}   (paths from root,
                                                                                                  or root/img_raw)

FashionIQ's own (github.com/XiaoxiaoGuo/fashion-iq; category dress, shirt or toptee)::

    <root>/captions/cap.<category>.<split>.json        [{"candidate": "B00...", "target": "B00...",
                                                         "captions": ["is longer", "has no sleeves"]}, ...]
    <root>/image_splits/split.<category>.<split>.json  ["B00...", ...]
    <root>/images/<id>.png (or .jpg / .jpeg)

MIEB's (a snapshot of mteb/mbeir_cirr_task7 or mteb/mbeir_fashioniq_task7, as mteb's retrieval loader reads it)::

    <root>/corpus/<split>-*.parquet     columns id, image
    <root>/queries/<split>-*.parquet    columns id, text, image
    <root>/default/<split>-*.parquet    columns query-id, corpus-id, score        (or qrels/<split>-*.parquet)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.mieb.mieb_layouts import ImageList, _read_parquet
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource, OpenOptions

CATEGORIES = ("dress", "shirt", "toptee")  # FashionIQ's
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
CIRR_CAPTIONS = r"cap\.rc2\.(.+)\.json"


@dataclass
class ComposedData:
    name: str
    split: str
    root: Path
    layout: str  # cirr, fashioniq or mieb
    images: ImageList  # every distinct image: the gallery's and the references'
    gallery: np.ndarray  # (m,): the candidates' rows in ``images``, in the layout's order
    gallery_ids: list[str]  # the candidates' ids (pytrec_eval orders tied documents by them)
    texts: list[str]  # distinct modifying texts
    query_image: np.ndarray  # (n,): each query's reference image, a row in ``images``
    query_text: np.ndarray  # (n,): each query's text, a row in ``texts``
    reference: np.ndarray  # (n,): the reference image's position in the gallery, -1 when it is not one
    targets: list[np.ndarray]  # per query: its target images' gallery positions
    gains: list[np.ndarray]  # per query: their relevance (qrels score; 1 for CIRR and FashionIQ)
    excludes_reference: bool  # the layout's own protocol: CIRR's evaluation never retrieves the reference
    keys: list[str] | None
    files: list[Path] = field(default_factory=list)
    # CIRR: per query the gallery positions of its img_set members (Recall_subset's candidates, the reference among
    # them as the file lists it); None for layouts without subsets
    subsets: list[np.ndarray] | None = None


class _Gallery:
    """Builds the images (each file or cell once) and the gallery."""

    def __init__(self, name: str, split: str, root: Path):
        self.images = ImageList(name=name, split=split, task="zeroshot_retrieval", root=root,
                                kind="composed_retrieval")
        self.rows: dict[Any, int] = {}
        self.position: dict[str, int] = {}
        self.gallery: list[int] = []
        self.ids: list[str] = []

    def image(self, source: Path | tuple[Path, int, str], where: str) -> int:
        if source not in self.rows:
            self.rows[source] = len(self.images.sources)
            self.images.sources.append(source)
            self.images.where.append(f"{source if isinstance(source, Path) else source[0]} ({where})")
        return self.rows[source]

    def candidate(self, image_id: str, source: Path | tuple[Path, int, str], where: str) -> None:
        if image_id in self.position:
            raise DatasetError(f"{where}: image id {image_id!r} is listed twice")
        self.position[image_id] = len(self.gallery)
        self.gallery.append(self.image(source, where))
        self.ids.append(image_id)


def _load_json(path: Path, expected: type, form: str) -> Any:
    try:
        value = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: not valid JSON ({e}); expected {form}") from e
    if not isinstance(value, expected):
        raise DatasetError(f"{path}: expected {form} (got a JSON {type(value).__name__})")
    return value


def _record(path: Path, i: int, record: Any, required: tuple[str, ...], form: str) -> dict[str, Any]:
    if not isinstance(record, dict) or any(not isinstance(record.get(k), str) or not record[k] for k in required):
        raise DatasetError(f"{path} record {i}: expected an object with {' and '.join(map(repr, required))} as "
                           f"non-empty strings ({form})")
    return record


def _splits(folder: Path, pattern: str) -> str:
    found = sorted({m[1] for p in folder.glob("*.json") if (m := re.fullmatch(pattern, p.name))})
    return ", ".join(found) or "none"


class _Queries:
    def __init__(self) -> None:
        self.texts: dict[str, int] = {}
        self.image: list[int] = []
        self.text: list[int] = []
        self.reference: list[int] = []
        self.targets: list[np.ndarray] = []
        self.gains: list[np.ndarray] = []
        self.keys: list[str] = []
        self.subsets: list[np.ndarray] = []

    def add(self, key: str, image: int, text: str, reference: int, targets: list[int],  # noqa: PLR0913
            gains: list[float] | None = None) -> None:
        self.keys.append(key)
        self.image.append(image)
        self.text.append(self.texts.setdefault(text, len(self.texts)))
        self.reference.append(reference)
        self.targets.append(np.asarray(targets, np.int64))
        self.gains.append(np.asarray(gains if gains is not None else [1.0] * len(targets), np.float64))


def _data(name: str, root: Path, layout: str, gallery: _Gallery, queries: _Queries, *,
          excludes: bool, files: list[Path]) -> ComposedData:
    if not queries.keys:
        raise DatasetError(f"composed-retrieval folder {root} ({layout}): no queries")
    return ComposedData(name, gallery.images.split, root, layout, gallery.images, np.asarray(gallery.gallery, np.int64),
                        gallery.ids, list(queries.texts), np.asarray(queries.image, np.int64),
                        np.asarray(queries.text, np.int64), np.asarray(queries.reference, np.int64), queries.targets,
                        queries.gains, excludes, queries.keys, files, queries.subsets or None)


# -- CIRR -----------------------------------------------------------------------------------------------------------
def cirr_root(root: Path) -> Path | None:
    for base in (root, root / "cirr"):
        if any((base / "captions").glob("cap.rc2.*.json")):
            return base
    return None


def open_cirr(name: str, root: Path, split: str, limit: int | None) -> ComposedData:
    base = cirr_root(root) or root
    captions = base / "captions" / f"cap.rc2.{split}.json"
    splits = base / "image_splits" / f"split.rc2.{split}.json"
    for path in (captions, splits):
        if not path.is_file():
            raise DatasetError(f"CIRR folder {root}: {path.relative_to(root)} is missing (splits there: "
                               f"{_splits(base / 'captions', CIRR_CAPTIONS)})")
    gallery = _Gallery(name, split, root)
    for image_id, relative in _load_json(splits, dict, "CIRR's {image name: relative path}").items():
        where = f"{splits} {image_id!r}"
        found = next((b / relative for b in (base, root, base / "img_raw", root / "img_raw")
                      if isinstance(relative, str) and (b / relative).is_file()), None)
        if found is None:
            raise DatasetError(f"{where}: image {relative!r} not found under {root} (or its img_raw/)")
        gallery.candidate(image_id, found, where)
    queries = _Queries()
    form = "CIRR's cap.rc2 record: pairid, reference, target_hard, caption"
    for i, raw in enumerate(_load_json(captions, list, "CIRR's list of caption records")):
        if limit is not None and len(queries.keys) >= limit:
            break
        if isinstance(raw, dict) and "target_hard" not in raw and "reference" in raw:
            raise DatasetError(f"{captions} record {i}: no 'target_hard' (CIRR's test1 targets are hidden and "
                               f"scored on its evaluation server; evaluate --split val)")
        record = _record(captions, i, raw, ("reference", "target_hard", "caption"), form)
        for field_name in ("reference", "target_hard"):
            if record[field_name] not in gallery.position:
                raise DatasetError(f"{captions} record {i}: {field_name} {record[field_name]!r} is not in {splits}")
        reference = gallery.position[record["reference"]]
        members = _img_set(captions, i, record, gallery, splits)
        if (members is None) != (not queries.subsets) and queries.keys:
            raise DatasetError(f"{captions} record {i}: {'no' if members is None else 'an'} img_set, where the "
                               f"records before it {'have one' if queries.subsets else 'have none'} (CIRR's "
                               f"Recall_subset needs every query's)")
        queries.add(str(record.get("pairid", i)), int(gallery.gallery[reference]), record["caption"], reference,
                    [gallery.position[record["target_hard"]]])
        if members is not None:
            queries.subsets.append(members)
    return _data(name, root, "cirr", gallery, queries, excludes=True, files=[captions, splits])


def _img_set(captions: Path, i: int, record: dict[str, Any], gallery: _Gallery, splits: Path) -> np.ndarray | None:
    """The gallery positions of a CIRR record's ``img_set`` members (distinct, in the file's order), or None when
    the record has no ``img_set``."""
    if "img_set" not in record:
        return None
    img_set = record["img_set"]
    members = img_set.get("members") if isinstance(img_set, dict) else None
    if not isinstance(members, list) or not members or not all(isinstance(m, str) for m in members):
        raise DatasetError(f"{captions} record {i}: img_set must be an object whose 'members' is a list of image "
                           f"names (CIRR's {{\"id\": ..., \"members\": [...]}})")
    unknown = [m for m in members if m not in gallery.position]
    if unknown:
        raise DatasetError(f"{captions} record {i}: img_set member {unknown[0]!r} is not in {splits}")
    return np.asarray(list(dict.fromkeys(gallery.position[m] for m in members)), np.int64)


# -- FashionIQ ------------------------------------------------------------------------------------------------------
def fashioniq_category(name: str, root: Path, split: str) -> str:
    """The category the dataset name ends with (``fashioniq_dress``, ``fashioniq/shirt``), else the only one the
    folder holds for ``split``."""
    present = [c for c in CATEGORIES if (root / "captions" / f"cap.{c}.{split}.json").is_file()]
    named = [c for c in CATEGORIES if re.search(rf"(^|[/_\-.]){c}$", name)]
    if named:
        return named[0]
    if len(present) == 1:
        return present[0]
    raise DatasetError(f"FashionIQ folder {root}: name the category in the dataset name (e.g. {name}_dress); "
                       f"the {split} split has {', '.join(present) or 'no category'}")


def fashioniq_text(captions: list[str]) -> str:
    """FashionIQ's two relative captions as one modifying text, as CLIP4Cir joins them for evaluation."""
    first, *rest = [c.strip(".?, ") for c in captions]
    return " and ".join([first.capitalize(), *rest])


def open_fashioniq(name: str, root: Path, split: str, limit: int | None) -> ComposedData:
    category = fashioniq_category(name, root, split)
    captions = root / "captions" / f"cap.{category}.{split}.json"
    splits = root / "image_splits" / f"split.{category}.{split}.json"
    for path in (captions, splits):
        if not path.is_file():
            raise DatasetError(f"FashionIQ folder {root}: {path.relative_to(root)} is missing")
    gallery = _Gallery(name, split, root)

    def image_file(image_id: Any, where: str) -> Path:
        found = next((p for s in IMAGE_SUFFIXES if (p := root / "images" / f"{image_id}{s}").is_file()), None)
        if found is None:
            raise DatasetError(f"{where}: image {image_id!r} not found (images/<id>.png, .jpg or .jpeg under {root})")
        return found

    for image_id in _load_json(splits, list, "FashionIQ's list of image ids"):
        gallery.candidate(str(image_id), image_file(image_id, f"{splits}"), f"{splits}")
    queries = _Queries()
    form = "FashionIQ's cap record: candidate, target, captions"
    for i, raw in enumerate(_load_json(captions, list, "FashionIQ's list of caption records")):
        if limit is not None and len(queries.keys) >= limit:
            break
        record = _record(captions, i, raw, ("candidate", "target"), form)
        texts = record.get("captions")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise DatasetError(f"{captions} record {i}: 'captions' must be a list of strings ({form})")
        if record["target"] not in gallery.position:
            raise DatasetError(f"{captions} record {i}: target {record['target']!r} is not in {splits}")
        where = f"{captions} record {i}"
        reference = gallery.position.get(record["candidate"], -1)
        image = int(gallery.gallery[reference]) if reference >= 0 else \
            gallery.image(image_file(record["candidate"], where), where)
        queries.add(f"{category}-{i}", image, fashioniq_text(texts), reference, [gallery.position[record["target"]]])
    return _data(name, root, "fashioniq", gallery, queries, excludes=False, files=[captions, splits])


# -- MIEB's hub layout ----------------------------------------------------------------------------------------------
def mieb_files(root: Path, config: str, split: str) -> list[Path]:
    return sorted((root / config).glob(f"{split}-*.parquet"))


def _columns(files: list[Path], columns: tuple[str, ...], what: str) -> dict[str, list[Any]]:
    import pyarrow.parquet as pq

    out: dict[str, list[Any]] = {c: [] for c in columns}
    for file in files:
        missing = set(columns) - set(pq.read_schema(file).names)
        if missing:
            raise DatasetError(f"{file}: not MIEB's {what} (no column {', '.join(sorted(missing))}; expected "
                               f"{', '.join(columns)})")
        table = _read_parquet(file, [c for c in columns if c != "image"])
        for c in columns:
            out[c].extend([(file, row, "image") for row in range(table.num_rows)] if c == "image" else
                          table.column(c).to_pylist())
    return out


def open_mieb_composed(name: str, root: Path, split: str, limit: int | None) -> ComposedData:
    corpus_files, query_files = mieb_files(root, "corpus", split), mieb_files(root, "queries", split)
    qrel_files = mieb_files(root, "default", split) or mieb_files(root, "qrels", split)
    if not (corpus_files and query_files and qrel_files):
        raise DatasetError(f"MIEB composed-retrieval folder {root}: corpus/, queries/ and default/ (or qrels/) "
                           f"need {split}-*.parquet files")
    gallery = _Gallery(name, split, root)
    corpus = _columns(corpus_files, ("id", "image"), "corpus")
    for image_id, cell in zip(corpus["id"], corpus["image"], strict=True):
        gallery.candidate(str(image_id), cell, f"{cell[0]} row {cell[1]}")
    relevant: dict[str, dict[str, float]] = {}
    qrels = _columns(qrel_files, ("query-id", "corpus-id", "score"), "qrels")
    for q, d, s in zip(qrels["query-id"], qrels["corpus-id"], qrels["score"], strict=True):
        if str(d) not in gallery.position:
            raise DatasetError(f"{qrel_files[0].parent}: corpus-id {d!r} (query {q!r}) is not in the corpus")
        relevant.setdefault(str(q), {})[str(d)] = float(s)
    queries = _Queries()
    found = _columns(query_files, ("id", "text", "image"), "queries")
    for query_id, text, cell in zip(found["id"], found["text"], found["image"], strict=True):
        if limit is not None and len(queries.keys) >= limit:
            break
        judged = {d: s for d, s in relevant.get(str(query_id), {}).items() if s > 0}
        if not judged:  # pytrec_eval skips a query without a relevant document, as mteb does
            continue
        if not isinstance(text, str) or not text:
            raise DatasetError(f"{cell[0]} row {cell[1]}: query {query_id!r} has no text (a composed query is an "
                               f"image and a text)")
        queries.add(str(query_id), gallery.image(cell, f"{cell[0]} row {cell[1]}"), text, -1,
                    [gallery.position[d] for d in judged], list(judged.values()))
    return _data(name, root, "mieb", gallery, queries, excludes=False, files=corpus_files + query_files + qrel_files)


def composed_layout(root: Path) -> str | None:
    if cirr_root(root) is not None:
        return "cirr"
    if any((root / "captions").glob("cap.*.*.json")) and (root / "image_splits").is_dir():
        return "fashioniq"
    if any((root / "corpus").glob("*.parquet")) and any((root / "queries").glob("*.parquet")):
        import pyarrow.parquet as pq

        names = pq.read_schema(next(iter(sorted((root / "queries").glob("*.parquet"))))).names
        return "mieb" if {"text", "image"} <= set(names) else None
    return None


def open_composed(name: str, root: Path, split: str, limit: int | None) -> ComposedData:
    root = Path(root)
    layout = composed_layout(root)
    readers = {"cirr": open_cirr, "fashioniq": open_fashioniq, "mieb": open_mieb_composed}
    if layout is None:
        raise DatasetError(f"composed-retrieval folder {root}: no CIRR (captions/cap.rc2.<split>.json), FashionIQ "
                           f"(captions/cap.<category>.<split>.json) or MIEB (corpus/, queries/ with text and image) "
                           f"files there")
    return readers[layout](name, root, split, limit)


class ComposedFolders(DatasetSource):
    name = "composed_retrieval"
    description = "composed image retrieval queries (CIRR's, FashionIQ's or MIEB's files)"
    priority = 62
    only_for = ("composed_retrieval",)

    def claims(self, ref: DatasetRef) -> bool:
        root = ref.root
        return root is not None and root.is_dir() and composed_layout(root) is not None

    def task(self, ref: DatasetRef) -> str:
        return "composed_retrieval"

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> ComposedData:
        return open_composed(ref.name, ref.folder("CIRR's, FashionIQ's or MIEB's files"), split, limit)
