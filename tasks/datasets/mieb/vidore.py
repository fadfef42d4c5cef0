"""ViDoRe's layouts (visual document retrieval: text queries against page images; the task is
tasks/evaluation/visual_document_retrieval.py), read into the any-to-any retrieval data (tasks/datasets/any2any.py)
so the any-to-any task's cache entries and scoring serve them. Two layouts, each as a snapshot of the Hugging Face
dataset repository (``hf download <repo> --repo-type dataset --local-dir DIR``) holds it:

ViDoRe v1's question-answering sets (``vidore/docvqa_test_subsampled``, ``vidore/tabfquad_test_subsampled``, ...)::

    <root>/data/<split>-*.parquet   (or <root>/<split>-*.parquet)   one row a page: query (null for a page no
                                    query asks about), image ({"bytes", "path"}), image_filename, answer, ...

read as ViDoRe's own BEIR conversion reads it (vidore-benchmark's ``convert_ds_to_beir``, the source of the
``*_beir`` sets mteb evaluates): the pages are the distinct images in first-seen order (here by their encoded bytes;
that script compares decoded pixels, which differs only for one page stored twice under different encodings), the
queries are the distinct non-null query texts in first-seen order, and each query is relevant (gain 1) to the page of
every row that asks it.

BEIR-style sets (ViDoRe v2, ``vidore/esg_reports_v2``, ...; and the ``*_beir`` copies MIEB's ViDoRe tasks load,
``mteb/docvqa_test_subsampled_beir``, ...)::

    <root>/corpus/<split>-*.parquet    corpus-id, image           (other columns are not read)
    <root>/queries/<split>-*.parquet   query-id, query[, language]
    <root>/qrels/<split>-*.parquet     query-id, corpus-id, score

(``<config>/<split>/*.parquet`` too, the hub's converted-Parquet branch.) Where the queries have a ``language`` column
(ViDoRe v2's translated queries, mteb's hf subsets ``english``, ``french``, ...), one language is evaluated, as mteb
evaluates one subset: ``--language`` names it (``en``, ``fr``, ``es``, ``de`` or the column's own value).

Each distinct image is read once (``PageImages``: Parquet cells, read one row group at a time) and each distinct
query text is one text row. Scores follow mteb: ``int(score)`` as the gain, relevant when above 0.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.datasets.any2any import Any2AnyData, Side, SideImages
from clipcache.tasks.datasets.base import relative_name
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource, OpenOptions

NAME = "visual_document_retrieval"
Cell = tuple[Path, int]  # (Parquet file, row) of an image cell
LANGUAGES = {"en": "english", "fr": "french", "es": "spanish", "de": "german", "it": "italian", "pt": "portuguese"}
CACHED_GROUPS = 4  # row groups of pages kept decoded-from-Parquet at once (one per decoding thread, about)


@dataclass
class PageImages(SideImages):
    """The distinct page images: cells of the ``image`` column of Parquet files, read a row group at a time, so
    memory holds a few row groups' encoded pages, never a whole file's."""

    cells: list[Cell] = field(default_factory=list)
    column: str = "image"
    _groups: dict[tuple[Path, int], Any] = field(default_factory=dict, repr=False)
    _starts: dict[Path, np.ndarray] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.cells)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        files = sorted({file for file, _ in self.cells})
        return {"format": "vidore-pages", "files": memo.fingerprint(files, root=self.root),
                "cells": digest([(relative_name(f, self.root), r) for f, r in self.cells])}

    def describe(self, index: int) -> str:
        return self.where[index]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_groups": {}}  # a decoding worker process reads the row groups it needs itself

    def read_image_bytes(self, index: int) -> bytes:
        import pyarrow.parquet as pq

        file, row = self.cells[index]
        if file not in self._starts:
            meta = pq.ParquetFile(file).metadata
            self._starts[file] = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        group = int(np.searchsorted(self._starts[file], row, side="right")) - 1
        table = self._groups.get((file, group))
        if table is None:
            table = pq.ParquetFile(file).read_row_group(group, columns=[self.column]).column(self.column)
            while len(self._groups) >= CACHED_GROUPS:
                self._groups.pop(next(iter(self._groups)), None)
            self._groups[file, group] = table
        return _image_bytes(table[row - int(self._starts[file][group])].as_py(), self.where[index])


def _image_bytes(value: Any, where: str) -> bytes:
    data = value.get("bytes") if isinstance(value, dict) else value
    if not isinstance(data, bytes | bytearray) or not data:  # null, or an image stored by path only
        raise DatasetError(f"{where}: no image bytes (ViDoRe's Parquet files embed each page)")
    return bytes(data)


# -- finding the files ----------------------------------------------------------------------------------------------
def config_files(root: Path, config: str, split: str) -> list[Path]:
    """``<config>/<split>-*.parquet`` of a snapshot, else the converted branch's ``<config>/<split>/*.parquet``."""
    return sorted((root / config).glob(f"{split}-*.parquet")) or sorted((root / config / split).glob("*.parquet"))


def qa_files(root: Path, split: str) -> list[Path]:
    return sorted(root.glob(f"data/{split}-*.parquet")) or sorted(root.glob(f"{split}-*.parquet"))


def _schema(file: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(file).names)
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{file}: not a readable Parquet file ({e})") from e


def vidore_layout(root: Path) -> str | None:
    """``beir`` (corpus/, queries/ with a ``query`` column), ``qa`` (Parquet rows with ``query`` and ``image``) or
    None. Reads Parquet footers only."""
    queries = sorted((root / "queries").glob("**/*.parquet"))
    if queries and any((root / "corpus").glob("**/*.parquet")):
        return "beir" if "query" in _schema(queries[0]) else None
    qa = sorted(root.glob("data/*.parquet")) or sorted(root.glob("*.parquet"))
    if qa and {"query", "image"} <= set(_schema(qa[0])):
        return "qa"
    return None


def _columns(files: list[Path], columns: tuple[str, ...], what: str) -> dict[str, list[Any]]:
    """Whole columns (no image) of ``files``, concatenated, with each value's (file, row)."""
    import pyarrow.parquet as pq

    out: dict[str, list[Any]] = {c: [] for c in (*columns, "@cell")}
    for file in files:
        missing = set(columns) - set(_schema(file))
        if missing:
            raise DatasetError(f"{file}: not ViDoRe's {what} (no column {', '.join(sorted(missing))}; expected "
                               f"{', '.join(columns)})")
        table = pq.read_table(file, columns=list(columns))
        for c in columns:
            out[c].extend(table.column(c).to_pylist())
        out["@cell"].extend((file, row) for row in range(table.num_rows))
    return out


def _image_digests(files: list[Path], column: str = "image") -> list[str]:
    """Each row's image bytes' SHA-256, reading one record batch at a time."""
    import pyarrow.parquet as pq

    found: list[str] = []
    for file in files:
        if column not in _schema(file):
            raise DatasetError(f"{file}: no {column!r} column (ViDoRe's pages)")
        for row, value in enumerate(v for batch in pq.ParquetFile(file).iter_batches(batch_size=32, columns=[column])
                                    for v in batch.column(0).to_pylist()):
            found.append(hashlib.sha256(_image_bytes(value, f"{file} row {row}")).hexdigest())
    return found


# -- building the any-to-any data -----------------------------------------------------------------------------------
class _Pages:
    """Corpus records (documents) and their distinct images."""

    def __init__(self, name: str, split: str, root: Path):
        self.images = PageImages(name=f"{name}:pages", split=split, task="zeroshot_retrieval", root=root)
        self.by_digest: dict[str, int] = {}
        self.ids: list[str] = []
        self.row: list[int] = []

    def add(self, doc_id: str, digest_: str, cell: Cell) -> None:
        if digest_ not in self.by_digest:
            self.by_digest[digest_] = len(self.images.cells)
            self.images.cells.append(cell)
            self.images.where.append(f"{cell[0]} row {cell[1]} (page {doc_id})")
        self.ids.append(doc_id)
        self.row.append(self.by_digest[digest_])

    def side(self) -> tuple[Side, dict[str, int]]:
        """The corpus in pytrec_eval's order for equal scores (document id descending, as text), so the stable tie
        rule of the scoring (equal scores: lower position first) ranks as mteb does; and each id's position."""
        order = sorted(range(len(self.ids)), key=lambda i: self.ids[i], reverse=True)
        ids = [self.ids[i] for i in order]
        side = Side(ids, np.ones(len(ids), dtype=bool), np.asarray([self.row[i] for i in order], np.int64),
                    self.images, [])
        return side, {d: p for p, d in enumerate(ids)}


@dataclass
class VidoreData(Any2AnyData):
    layout: str = "beir"  # beir or qa
    language: str | None = None  # the queries' language evaluated, where the queries have several
    unjudged: int = 0  # queries with judgments that are all 0: pytrec_eval scores them 0 on every metric

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {"format": f"vidore-{self.layout}", "content": memo.fingerprint(self.files, root=self.root),
                "language": self.language}


def _text_side(ids: list[str], texts: list[str]) -> Side:
    rows: dict[str, int] = {}
    row = [rows.setdefault(t, len(rows)) for t in texts]
    return Side(ids, np.zeros(len(ids), dtype=bool), np.asarray(row, np.int64),
                SideImages(name="queries", split="", task="zeroshot_retrieval"), list(rows))


def _finish(name: str, split: str, root: Path, layout: str, *, pages: _Pages,  # noqa: PLR0913
            queries: list[tuple[str, str, dict[str, float]]], limit: int | None, files: list[Path],
            language: str | None = None) -> VidoreData:
    """``queries``: (id, text, {doc id: score}) in file order. Those with a relevant document are evaluated (the
    first ``limit`` of them); those judged but with no score above 0 are counted, as pytrec_eval scores them 0."""
    corpus, position = pages.side()
    kept: list[tuple[str, str, dict[str, float]]] = []
    unjudged = 0
    for qid, text, judged in queries:
        for doc in judged:
            if doc not in position:
                raise DatasetError(f"ViDoRe folder {root}: qrels name corpus-id {doc!r} (query {qid!r}), which is "
                                   f"not in the corpus")
        if limit is not None and len(kept) >= limit:
            break
        if any(s > 0 for s in judged.values()):
            kept.append((qid, text, {d: s for d, s in judged.items() if s > 0}))
        elif judged:
            unjudged += 1
    if not kept:
        raise DatasetError(f"ViDoRe folder {root}: no query of split {split!r} has a relevant page")
    relevant = [np.asarray([position[d] for d in judged], np.int64) for _, _, judged in kept]
    gains = [np.asarray(list(judged.values()), np.float64) for _, _, judged in kept]
    side = _text_side([q for q, _, _ in kept], [t for _, t, _ in kept])
    return VidoreData(name, split, root, corpus, side, relevant, gains, files, layout=layout, language=language,
                      unjudged=unjudged)


def open_vidore_qa(name: str, root: Path, split: str, limit: int | None) -> VidoreData:
    files = qa_files(root, split)
    if not files:
        raise DatasetError(f"ViDoRe folder {root}: no data/{split}-*.parquet (or {split}-*.parquet)")
    rows = _columns(files, ("query",), "question-answering rows")
    digests = _image_digests(files)
    pages = _Pages(name, split, root)
    page_of: list[str] = []  # each row's page: its corpus-id, the page's first-seen index, as ViDoRe numbers them
    for value, cell in zip(digests, rows["@cell"], strict=True):
        if value not in pages.by_digest:
            pages.add(str(len(pages.ids)), value, cell)
        page_of.append(str(pages.by_digest[value]))
    judged: dict[str, dict[str, float]] = {}
    for query, doc in zip(rows["query"], page_of, strict=True):
        if query is None:  # a page no query asks about: a distractor
            continue
        if not isinstance(query, str):
            raise DatasetError(f"ViDoRe folder {root}: a 'query' value is not a string ({query!r})")
        judged.setdefault(query, {})[doc] = 1.0
    queries = [(str(i), text, docs) for i, (text, docs) in enumerate(judged.items())]
    return _finish(name, split, root, "qa", pages=pages, queries=queries, limit=limit, files=files)


def _language(values: list[Any], asked: str, root: Path) -> str | None:
    present = sorted({str(v) for v in values if v is not None})
    chosen = asked if asked in present else LANGUAGES.get(asked)
    if chosen in present:
        return chosen
    if len(present) <= 1:
        return None  # one language: nothing to choose
    raise DatasetError(f"ViDoRe folder {root}: the queries are in {', '.join(present)}; choose one with --language "
                       f"(got {asked!r})")


def open_vidore_beir(name: str, root: Path, split: str, limit: int | None, language: str = "en") -> VidoreData:
    found = {c: config_files(root, c, split) for c in ("corpus", "queries", "qrels")}
    if not all(found.values()):
        missing = ", ".join(f"{c}/{split}-*.parquet" for c, f in found.items() if not f)
        raise DatasetError(f"ViDoRe folder {root}: {missing} missing (BEIR layout: corpus, queries and qrels)")
    corpus = _columns(found["corpus"], ("corpus-id",), "corpus")
    digests = _image_digests(found["corpus"])
    pages = _Pages(name, split, root)
    seen: set[str] = set()
    for doc, value, cell in zip(corpus["corpus-id"], digests, corpus["@cell"], strict=True):
        if str(doc) in seen:
            raise DatasetError(f"{cell[0]} row {cell[1]}: corpus-id {doc!r} appears twice")
        seen.add(str(doc))
        pages.add(str(doc), value, cell)
    query_columns = ("query-id", "query", *(("language",) if "language" in _schema(found["queries"][0]) else ()))
    rows = _columns(found["queries"], query_columns, "queries")
    chosen = _language(rows["language"], language, root) if "language" in rows else None
    qrels = _columns(found["qrels"], ("query-id", "corpus-id", "score"), "qrels")
    judged: dict[str, dict[str, float]] = {}
    for q, d, s in zip(qrels["query-id"], qrels["corpus-id"], qrels["score"], strict=True):
        judged.setdefault(str(q), {})[str(d)] = float(int(s))  # mteb keeps int(score)
    queries = []
    for i, (qid, text) in enumerate(zip(rows["query-id"], rows["query"], strict=True)):
        if chosen is not None and rows["language"][i] != chosen:
            continue
        if not isinstance(text, str):
            raise DatasetError(f"{rows['@cell'][i][0]} row {rows['@cell'][i][1]}: query {qid!r} has no text")
        queries.append((str(qid), text, judged.get(str(qid), {})))
    files = found["corpus"] + found["queries"] + found["qrels"]
    return _finish(name, split, root, "beir", pages=pages, queries=queries, limit=limit, files=files, language=chosen)


def open_vidore(name: str, root: Path, split: str, limit: int | None, language: str = "en") -> VidoreData:
    root = Path(root)
    layout = vidore_layout(root) if root.is_dir() else None
    if layout == "beir":
        return open_vidore_beir(name, root, split, limit, language)
    if layout == "qa":
        return open_vidore_qa(name, root, split, limit)
    raise DatasetError(f"ViDoRe folder {root}: neither ViDoRe's question-answering rows (data/{split}-*.parquet with "
                       f"query and image) nor its BEIR layout (corpus/, queries/, qrels/ Parquet files) is there")


class VidoreFolders(DatasetSource):
    """Asked before the visual STS folders (a v1 snapshot also holds data/test-*.parquet): claims a folder only when
    its Parquet columns are ViDoRe's."""

    name = "vidore"
    description = "ViDoRe's page-retrieval sets (question-answering rows, or corpus/queries/qrels Parquet files)"
    priority = 59
    only_for = (NAME,)

    def claims(self, ref: DatasetRef) -> bool:
        root = ref.root
        try:
            return root is not None and root.is_dir() and vidore_layout(root) is not None
        except DatasetError:
            return False

    def task(self, ref: DatasetRef) -> str:
        return NAME

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> VidoreData:
        return open_vidore(ref.name, ref.folder("ViDoRe's Parquet files"), split, limit, options.language)
