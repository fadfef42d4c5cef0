"""WinoGAViL (Bitton et al. 2022) in the layout DataComp evaluates it from (``misc/winogavil``, issue #27).

DataComp (eval_utils/wino_eval.py) calls ``datasets.load_dataset("nlphuji/winogavil", split="test",
cache_dir=<data_root>/hf_cache)``: the data it reads is the Hugging Face ``datasets`` cache that call fills (or that
DataComp's download_evalsets.py filled), an Arrow stream file written by ``datasets``::

    <root>/hf_cache/nlphuji___winogavil/<config>/<version>/<hash>/winogavil-test.arrow
                                                                 (or winogavil-test-00000-of-0000N.arrow shards)

``--dataset_root`` may name DataComp's data root (holding ``hf_cache``), the ``hf_cache`` folder itself, the
``nlphuji___winogavil`` folder, or the folder holding the Arrow file; it must lead to exactly one such folder. One
row per game, with the fields DataComp reads: ``cue`` (the spymaster's word), ``candidates`` (the candidate images'
names), ``associations`` (the names the cue was given for) and ``candidate_images`` (one image per candidate: the
``datasets`` Image struct ``{"bytes", "path"}``: embedded bytes, or a file the cache's download folder holds; a
cache moved from another machine is found again below its own ``downloads/`` folder). ``ID`` names the game's
sample rows where present. DataComp's ``candidates`` / ``associations`` are compared by name (``np.isin``): an
association that is no candidate is not counted.

Every distinct image (by content for embedded bytes, by file otherwise) and every distinct cue prompt is listed once,
so each is encoded once; the task (tasks/evaluation/winogavil.py) and the rule (tasks/score/winogavil.py) read these.
The file is read with pyarrow (no ``datasets`` import, no loading script run).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.datasets.base import EvalDataset, relative_name
from clipcache.tasks.datasets.datacomp import WINOGAVIL
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource, OpenOptions

NAME = WINOGAVIL  # DataComp's task key, the dataset's name here
CACHE_FOLDER = "nlphuji___winogavil"  # what datasets names the cache folder of nlphuji/winogavil
SPLIT = "test"  # the one split DataComp (and the dataset) has
COLUMNS = ("cue", "candidates", "associations", "candidate_images")
_ARROW = re.compile(r"^winogavil-test(-\d{5}-of-\d{5})?\.arrow$")
ArrowCell = tuple[int, int, int]  # (file number, row, candidate position)


def clip_prompt(cue: str) -> str:
    """DataComp's text for a cue (``get_clip_prompt``): lower-cased, after "An " when it starts with a vowel letter
    (a, e, i, o, u), else after "A "."""
    text = cue.lower()
    return f"An {text}" if text[0] in "aeiou" else f"A {text}"


def arrow_files(root: Path) -> list[Path]:
    """The Arrow file(s) of the test split under ``root`` (see the module docstring), in shard order; a
    DatasetError names what was looked for, or the folders when several caches are found."""
    root = Path(root)
    patterns = ["", "*/*/*/", f"{CACHE_FOLDER}/*/*/*/", f"hf_cache/{CACHE_FOLDER}/*/*/*/"]
    folders: dict[Path, set[Path]] = {}
    for pattern in patterns:
        for path in root.glob(f"{pattern}winogavil-test*.arrow"):
            if _ARROW.match(path.name) and path.is_file():
                folders.setdefault(path.parent, set()).add(path)
    if not folders:
        raise DatasetError(f"WinoGAViL folder {root}: no winogavil-test.arrow found (expected DataComp's Hugging "
                           f"Face cache: <root>/hf_cache/{CACHE_FOLDER}/<config>/<version>/<hash>/"
                           f"winogavil-test.arrow)")
    if len(folders) > 1:
        raise DatasetError(f"WinoGAViL folder {root}: several caches of the test split "
                           f"({', '.join(str(f) for f in sorted(folders))}); pass the one to read as --dataset_root")
    return sorted(next(iter(folders.values())))


def _read_arrow(path: Path) -> Any:
    """The table of a ``datasets`` cache file (an Arrow stream; the file format is accepted too)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            try:
                return pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                return pa.ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{path}: not a readable Arrow file ({e})") from e


@dataclass
class CandidateImages(EvalDataset):
    """The distinct candidate images, by position: image files, or image bytes embedded in the Arrow file(s)."""

    sources: list[Path | ArrowCell] = field(default_factory=list)
    content: list[str] = field(default_factory=list)  # per embedded image: its sha256 ("" for a file)
    where: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # the Arrow files, by file number
    root: Path = Path(".")
    _columns: dict[int, Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.sources)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        hashes = [memo.sha256(s) if isinstance(s, Path) else h for s, h in zip(self.sources, self.content,
                                                                                strict=True)]
        return {"format": "winogavil", "images": digest(hashes)}

    def describe(self, index: int) -> str:
        return self.where[index]

    def sample_key(self, index: int) -> str | None:
        source = self.sources[index]
        return relative_name(source, self.root) if isinstance(source, Path) else None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_columns": {}}  # a decoding worker maps the files it needs itself

    def read_image_bytes(self, index: int) -> bytes:
        source = self.sources[index]
        if isinstance(source, Path):
            return source.read_bytes()
        number, row, position = source
        if number not in self._columns:
            self._columns[number] = _read_arrow(self.files[number]).column("candidate_images")
        return bytes(self._columns[number][row].as_py()[position]["bytes"])


@dataclass
class WinogavilData:
    name: str
    split: str
    root: Path
    images: CandidateImages
    cues: list[str]  # distinct cue prompts ("A bison"), in first-seen order
    game_cue: np.ndarray  # (games,): each game's row in ``cues``
    game_images: list[np.ndarray]  # per game: its candidates' rows in ``images``, in the game's order
    truth: list[np.ndarray]  # per game: whether each candidate is an association (DataComp's np.isin)
    keys: list[str] | None  # the games' IDs, when every game has one
    files: list[Path]


def _cache_folder(file: Path) -> Path | None:
    """The ``datasets`` cache folder a file of it lies in (the parent of ``nlphuji___winogavil``), if any."""
    return next((p.parent for p in file.parents if p.name == CACHE_FOLDER), None)


def _image_file(raw: str, cache: Path | None, where: str) -> Path:
    """An image stored by path: as written when it lies inside the cache, else (a cache moved from another machine)
    the same path below this cache's ``downloads/`` folder; a path elsewhere (``/etc/...``) is never opened."""
    path = Path(raw)
    inside = cache is None or path.resolve().is_relative_to(cache.resolve())  # a path in the data never leaves it
    if path.is_absolute() and inside and path.is_file():
        return path
    if cache is not None and "downloads" in path.parts:
        moved = cache.joinpath(*path.parts[len(path.parts) - path.parts[::-1].index("downloads") - 1:])
        if moved.resolve().is_relative_to(cache.resolve()) and moved.is_file():  # no "downloads/../../x"
            return moved
    raise DatasetError(f"{where}: image file {raw!r} not found (nor below {cache or 'the cache'}/downloads)")


def _strings(value: Any, what: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DatasetError(f"{where}: {what!r} must be a list of strings (got {value!r:.80})")
    return value


class _Index:
    """Builds the distinct images and cue prompts while the games are read."""

    def __init__(self, images: CandidateImages):
        self.images = images
        self.rows: dict[Any, int] = {}
        self.cues: dict[str, int] = {}

    def image(self, cell: Any, source: Path | ArrowCell, where: str, cache: Path | None) -> int:
        data = cell.get("bytes") if isinstance(cell, dict) else None
        path = cell.get("path") if isinstance(cell, dict) else None
        if data:
            content = hashlib.sha256(data).hexdigest()
            key: Any = ("bytes", content)
        elif isinstance(path, str) and path:
            source, content = _image_file(path, cache, where), ""
            key = ("file", source)
        else:
            raise DatasetError(f"{where}: no image (neither bytes nor a path)")
        if key not in self.rows:
            self.rows[key] = len(self.images.sources)
            self.images.sources.append(source)
            self.images.content.append(content)
            self.images.where.append(where)
        return self.rows[key]

    def cue(self, cue: Any, where: str) -> int:
        if not isinstance(cue, str) or not cue:
            raise DatasetError(f"{where}: 'cue' must be a non-empty string (got {cue!r})")
        prompt = clip_prompt(cue)
        return self.cues.setdefault(prompt, len(self.cues))


def open_winogavil(name: str, root: Path, split: str, limit: int | None) -> WinogavilData:
    """Index the games under ``root`` (exactly the first ``limit`` with a limit); no image is decoded. A bad game is a
    DatasetError naming the file, the row and the field."""
    if split != SPLIT:
        raise DatasetError(f"dataset {name!r} has one split, {SPLIT!r} (got {split!r})")
    root = Path(root)
    files = arrow_files(root)
    images = CandidateImages(name=name, split=split, task="zeroshot_retrieval", files=files, root=root)
    index = _Index(images)
    game_cue: list[int] = []
    game_images: list[np.ndarray] = []
    truth: list[np.ndarray] = []
    ids: list[str | None] = []
    for number, file in enumerate(files):
        if limit is not None and len(game_cue) >= limit:
            break
        table = _read_arrow(file)
        missing = [c for c in COLUMNS if c not in table.column_names]
        if missing:
            raise DatasetError(f"{file}: no column {missing[0]!r} (DataComp reads {', '.join(COLUMNS)})")
        cache = _cache_folder(file)
        has_id = "ID" in table.column_names
        for row in range(table.num_rows):
            if limit is not None and len(game_cue) >= limit:
                break
            where = f"{file} row {row}"
            record = {c: table.column(c)[row].as_py() for c in (*COLUMNS[:3], *(("ID",) if has_id else ()))}
            candidates = _strings(record["candidates"], "candidates", where)
            associations = _strings(record["associations"], "associations", where)
            cells = table.column("candidate_images")[row].as_py()
            if not candidates or not isinstance(cells, list) or len(cells) != len(candidates):
                raise DatasetError(f"{where}: 'candidate_images' must hold one image per candidate "
                                   f"({len(candidates)} candidates, {len(cells) if isinstance(cells, list) else 0} "
                                   f"images)")
            game_cue.append(index.cue(record["cue"], where))
            rows = []
            for position in range(len(candidates)):
                rows.append(index.image(cells[position], (number, row, position), f"{where} candidate {position} "
                                        f"({candidates[position]!r})", cache))
            game_images.append(np.asarray(rows, np.int64))
            truth.append(np.isin(candidates, associations))
            ids.append(str(record["ID"]) if record.get("ID") is not None else None)
    if not game_cue:
        raise DatasetError(f"WinoGAViL folder {root}: no games")
    keys = [i for i in ids if i is not None]
    return WinogavilData(name, split, root, images, list(index.cues), np.asarray(game_cue, np.int64), game_images,
                         truth, keys if len(keys) == len(ids) else None, files)


class WinogavilSource(DatasetSource):
    """``misc/winogavil`` (its name in DataComp's tasklist.yml), read from DataComp's Hugging Face cache."""

    name = "winogavil"
    description = "WinoGAViL games in DataComp's Hugging Face cache (hf_cache/nlphuji___winogavil/...)"
    priority = 22
    only_for = ("winogavil",)

    def claims(self, ref: DatasetRef) -> bool:
        return ref.bare == NAME

    def task(self, ref: DatasetRef) -> str:
        return "winogavil"

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> WinogavilData:
        return open_winogavil(ref.name, ref.folder("DataComp's hf_cache (winogavil-test.arrow)"), split, limit)
