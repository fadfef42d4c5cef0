"""Local layouts of two MIEB task types (issue #28), and the dataset sources that find them by their files. The
tasks read them themselves (tasks/evaluation/visual_sts.py, tasks/evaluation/multiple_choice.py); docs/mieb.md
describes both.

Visual STS (``--task visual_sts``, MIEB's STS12-17 / STS-B ``VisualSTS`` sets), either of::

    <root>/pairs.jsonl     {"image1": "a.png", "image2": "b.png", "score": 3.2}      (optional "id")
    <root>/data/<split>-*.parquet  or  <root>/<split>-*.parquet                     (MIEB's own: mteb/rendered-sts12)
                           columns sentence1, sentence2 (image structs {"bytes", "path"}) and score

Multiple choice (``--task multiple_choice``, MIEB's Any2AnyMultipleChoice / vision-centric QA such as CV-Bench)::

    <root>/questions.jsonl {"image": "x.png", "question": "...", "choices": ["a", "b"], "answer": 1}  (optional "id")

``answer`` is the 0-based index of the right choice, or CV-Bench's ``"(A)"``, ``"(B)"``, ... Image paths are
relative to the folder (or absolute). A jsonl layout holds one split, ``test``.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.datasets.base import EvalDataset, iter_jsonl_records, relative_name, resolve_image_path
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource, OpenOptions

PAIRS = "pairs.jsonl"
QUESTIONS = "questions.jsonl"
STS_COLUMNS = ("sentence1", "sentence2")  # mteb's AbsTaskSTS.column_names, as its rendered sets name them
ParquetCell = tuple[Path, int, str]  # (file, row, column)


@dataclass
class ImageList(EvalDataset):
    """Images the image encoder walks by position: files, or image cells of Parquet files."""

    sources: list[Path | ParquetCell] = field(default_factory=list)
    where: list[str] = field(default_factory=list)  # per image: the record that names it, for error messages
    root: Path = Path(".")
    kind: str = "images"
    _columns: dict[tuple[Path, str], Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.sources)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        paths = [s for s in self.sources if isinstance(s, Path)]
        if len(paths) == len(self.sources):
            return {"format": self.kind, "images": memo.fingerprint(paths, root=self.root)}
        files = sorted({s[0] for s in self.sources if not isinstance(s, Path)})
        cells = [(relative_name(s[0], self.root), s[1], s[2]) for s in self.sources if not isinstance(s, Path)]
        return {"format": self.kind, "files": memo.fingerprint(files, root=self.root), "cells": digest(cells)}

    def describe(self, index: int) -> str:
        return self.where[index]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_columns": {}}  # a decoding worker process reads the columns it needs itself

    def read_image_bytes(self, index: int) -> bytes:
        source = self.sources[index]
        if isinstance(source, Path):
            return source.read_bytes()
        file, row, column = source
        if (file, column) not in self._columns:
            self._columns[file, column] = _read_parquet(file, [column]).column(column)
        value = self._columns[file, column][row].as_py()
        data = value.get("bytes") if isinstance(value, dict) else value
        if not data:  # a null cell, or a struct without bytes (an image stored by path only)
            raise DatasetError(f"{self.describe(index)}: no image bytes")
        return bytes(data)


def _read_parquet(file: Path, columns: list[str] | None = None) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(file, columns=columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{file}: not a readable Parquet file ({e})") from e


class _Images:
    """Builds an ImageList, each distinct file once."""

    def __init__(self, images: ImageList):
        self.images = images
        self.rows: dict[Path, int] = {}

    def add(self, raw: Any, where: str, base: Path, what: str) -> int:
        path = resolve_image_path(str(raw), base) if isinstance(raw, str) and raw else None
        if path is None:
            raise DatasetError(f"{where}: {what} {raw!r} not found (paths are relative to {base})")
        if path not in self.rows:
            self.rows[path] = len(self.images.sources)
            self.images.sources.append(path)
            self.images.where.append(f"{path} ({where})")
        return self.rows[path]


def _one_split(root: Path, file: str, split: str) -> Path:
    if split != "test":
        raise DatasetError(f"{root}/{file} holds one split, 'test' (asked for {split!r})")
    return root / file


# -- visual STS ---------------------------------------------------------------------------------------------------
@dataclass
class VisualStsData:
    name: str
    split: str
    root: Path
    images: ImageList
    pairs: np.ndarray  # (n, 2): each pair's two rows in ``images``
    gold: list[float]  # each pair's gold similarity, as the file gives it
    keys: list[str] | None  # each pair's id, where every record has one
    files: list[Path]


def sts_parquet_files(root: Path, split: str) -> list[Path]:
    """The split's Parquet files of a hub snapshot: ``data/<split>-*.parquet``, else ``<split>-*.parquet``."""
    return sorted(root.glob(f"data/{split}-*.parquet")) or sorted(root.glob(f"{split}-*.parquet"))


def open_visual_sts(name: str, root: Path, split: str, limit: int | None) -> VisualStsData:
    """The first ``limit`` pairs of ``pairs.jsonl``, else of the split's Parquet files."""
    root = Path(root)
    # ``task``: an EvalDataset names one of the image datasets' tasks; the encoder reads only the images
    images = ImageList(name=name, split=split, task="zeroshot_retrieval", root=root, kind="visual_sts")
    if (root / PAIRS).is_file():
        data = _read_pairs(name, _one_split(root, PAIRS, split), images, limit)
    elif files := sts_parquet_files(root, split):
        data = _read_sts_parquet(name, files, images, limit)
    else:
        raise DatasetError(f"visual STS folder {root}: neither {PAIRS} nor MIEB's Parquet files "
                           f"(data/{split}-*.parquet or {split}-*.parquet) are there")
    if not data.gold:
        raise DatasetError(f"visual STS folder {root}: no pairs")
    return data


def _gold(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DatasetError(f"{where}: 'score' must be a finite number (got {value!r})")
    return value  # as given: mteb normalises the column's own values


def _read_pairs(name: str, path: Path, images: ImageList, limit: int | None) -> VisualStsData:
    found = _Images(images)
    pairs: list[tuple[int, int]] = []
    gold: list[float] = []
    ids: list[str | None] = []
    for line_no, record in iter_jsonl_records(path, ("image1", "image2", "score")):
        if limit is not None and len(pairs) >= limit:
            break
        where = f"{path} line {line_no}"
        gold.append(_gold(record["score"], where))
        pairs.append((found.add(record["image1"], where, path.parent, "image1"),
                      found.add(record["image2"], where, path.parent, "image2")))
        ids.append(str(record["id"]) if "id" in record else None)
    keys = [i for i in ids if i is not None]
    return VisualStsData(name, images.split, path.parent, images, np.asarray(pairs, np.int64).reshape(-1, 2), gold,
                         keys if len(keys) == len(ids) else None, [path])


def _read_sts_parquet(name: str, files: list[Path], images: ImageList, limit: int | None) -> VisualStsData:
    """Each distinct image once (MIEB's rendered sets repeat sentences, so cells repeat images): cells with the same
    bytes are one row of ``images``, the first cell that holds them; a cell without bytes stays its own row (the
    encoder names it)."""
    import pyarrow.parquet as pq

    gold: list[float] = []
    pairs: list[list[int]] = []
    rows: dict[bytes, int] = {}  # SHA-256 of a cell's image bytes -> its row in ``images``
    for file in files:
        if limit is not None and len(gold) >= limit:
            break
        missing = {*STS_COLUMNS, "score"} - set(pq.read_schema(file).names)
        if missing:
            raise DatasetError(f"{file}: not a visual STS set (no column {', '.join(sorted(missing))}; MIEB's "
                               f"rendered sets have {', '.join(STS_COLUMNS)} and score)")
        table = _read_parquet(file, ["score", *STS_COLUMNS])
        scores = table.column("score").to_pylist()
        for row, value in enumerate(scores[:None if limit is None else limit - len(gold)]):
            gold.append(_gold(value, f"{file} row {row}"))
            pair = []
            for column in STS_COLUMNS:
                content = _cell_digest(table.column(column)[row].as_py())
                if content is None or content not in rows:
                    if content is not None:
                        rows[content] = len(images.sources)
                    images.sources.append((file, row, column))
                    images.where.append(f"{file} row {row} column {column}")
                pair.append(len(images.sources) - 1 if content is None else rows[content])
            pairs.append(pair)
    return VisualStsData(name, images.split, images.root, images, np.asarray(pairs, np.int64).reshape(-1, 2), gold,
                         None, files)


def _cell_digest(value: Any) -> bytes | None:
    """The SHA-256 of an image cell's bytes (an HF image struct or plain bytes); None when it holds none."""
    import hashlib

    data = value.get("bytes") if isinstance(value, dict) else value
    return hashlib.sha256(bytes(data)).digest() if isinstance(data, bytes | bytearray) and data else None


# -- multiple choice ----------------------------------------------------------------------------------------------
@dataclass
class MultipleChoiceData:
    name: str
    split: str
    root: Path
    images: ImageList
    question_image: np.ndarray  # (n,): each question's row in ``images``
    questions: list[str]  # distinct question texts
    question_text: np.ndarray  # (n,): each question's row in ``questions``
    choices: list[str]  # distinct choice texts, in first-seen order (mteb's corpus ids count them so)
    question_choices: list[np.ndarray]  # per question: its choices' rows in ``choices``, in its order
    answers: np.ndarray  # (n,): the right choice's index among the question's choices
    keys: list[str] | None
    files: list[Path]


LETTERS = {f"({letter})": i for i, letter in enumerate(string.ascii_uppercase)}  # CV-Bench's "(A)" -> 0, as mteb


def _answer(value: Any, n_choices: int, where: str) -> int:
    index = LETTERS.get(value, -1) if isinstance(value, str) else value
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n_choices:
        raise DatasetError(f"{where}: 'answer' must be the index of a choice (0 to {n_choices - 1}) or its letter "
                           f"\"(A)\"... (got {value!r})")
    return index


def open_multiple_choice(name: str, root: Path, split: str, limit: int | None) -> MultipleChoiceData:
    root = Path(root)
    path = _one_split(root, QUESTIONS, split)
    if not path.is_file():
        raise DatasetError(f"multiple-choice folder {root}: {QUESTIONS} is missing")
    images = ImageList(name=name, split=split, task="zeroshot_retrieval", root=root,
                       kind="multiple_choice")
    found = _Images(images)
    question_rows: dict[str, int] = {}
    choice_rows: dict[str, int] = {}
    image_of: list[int] = []
    text_of: list[int] = []
    answers: list[int] = []
    per_question: list[np.ndarray] = []
    ids: list[str | None] = []
    for line_no, record in iter_jsonl_records(path, ("image", "question", "choices", "answer")):
        if limit is not None and len(answers) >= limit:
            break
        where = f"{path} line {line_no}"
        question, choices = record["question"], record["choices"]
        if not isinstance(question, str):
            raise DatasetError(f"{where}: 'question' must be a string")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise DatasetError(f"{where}: 'choices' must be a list of at least two strings")
        answers.append(_answer(record["answer"], len(choices), where))
        image_of.append(found.add(record["image"], where, root, "image"))
        text_of.append(question_rows.setdefault(question, len(question_rows)))
        per_question.append(np.array([choice_rows.setdefault(c, len(choice_rows)) for c in choices], np.int64))
        ids.append(str(record["id"]) if "id" in record else None)
    if not answers:
        raise DatasetError(f"multiple-choice folder {root}: {QUESTIONS} has no questions")
    keys = [i for i in ids if i is not None]
    return MultipleChoiceData(name, split, root, images, np.asarray(image_of, np.int64), list(question_rows),
                              np.asarray(text_of, np.int64), list(choice_rows), per_question,
                              np.asarray(answers, np.int64), keys if len(keys) == len(ids) else None, [path])


# -- the sources that find them -------------------------------------------------------------------------------------
class VisualStsFolders(DatasetSource):
    """Asked after every other source (priority 60): a name another source knows keeps its own meaning, whatever
    its folder holds (a Winoground snapshot also has data/test-*.parquet)."""

    name = "visual_sts"
    description = "a folder of image pairs with gold similarity (pairs.jsonl, or MIEB's rendered-STS Parquet files)"
    priority = 60
    only_for = ("visual_sts",)

    def claims(self, ref: DatasetRef) -> bool:
        root = ref.root
        return root is not None and ((root / PAIRS).is_file() or any(root.glob("data/*.parquet"))
                                     or any(root.glob("*.parquet")))

    def task(self, ref: DatasetRef) -> str:
        return "visual_sts"

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> VisualStsData:
        return open_visual_sts(ref.name, ref.folder(f"{PAIRS} or MIEB's Parquet files"), split, limit)


class MultipleChoiceFolders(DatasetSource):
    name = "multiple_choice"
    description = "a folder of image questions with choices (questions.jsonl)"
    priority = 61
    only_for = ("multiple_choice",)

    def claims(self, ref: DatasetRef) -> bool:
        root = ref.root
        return root is not None and (root / QUESTIONS).is_file()

    def task(self, ref: DatasetRef) -> str:
        return "multiple_choice"

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> MultipleChoiceData:
        return open_multiple_choice(ref.name, ref.folder(QUESTIONS), split, limit)
