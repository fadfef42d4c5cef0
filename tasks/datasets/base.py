"""What every evaluation dataset provides to the encode stage.

A dataset is indexed up front (labels, captions and where each image lives) in the main process; images are decoded
later, by index, possibly in DataLoader worker processes. Indexing by position keeps sample order fixed whatever the
number of workers, makes ``--limit N`` exactly the first N samples and lets an interrupted encode resume at a position.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image

from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.image_bytes import opened_image

Task = Literal["zeroshot_classification", "zeroshot_retrieval", "image_caption_selection"]
# The tasks an image dataset can declare (a DatasetReader's ``task``); the registry of evaluation tasks is
# clipcache.tasks.evaluation.TASKS.
DATASET_TASKS: tuple[Task, ...] = ("zeroshot_classification", "zeroshot_retrieval", "image_caption_selection")


def read_text_list(path: str | Path, what: str, dataset: str | None = None) -> list[str] | None:
    """A JSON list of strings, a JSON object of such lists keyed by dataset name (clip_benchmark's custom files;
    None when ``dataset`` is not a key), or one entry per non-empty line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {path} ({e.strerror})") from e
    if path.suffix == ".json":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{what}: {path} is not valid JSON ({e.msg})") from e
        if isinstance(items, dict):
            items = items.get(dataset) if dataset is not None else None
            if items is None:
                return None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"{what}: {path} must hold a JSON list of strings, or an object of such lists keyed "
                              f"by dataset name")
        return items
    return [line.strip() for line in text.splitlines() if line.strip()]


def iter_jsonl_records(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-empty line; a line that is not a JSON object with ``required`` keys is a
    DatasetError naming the file and line."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:  # utf-8-sig: a byte-order mark on the first line is not part of the JSON
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{path} line {line_no}: not UTF-8 text (byte {e.start + 1}: "
                                   f"{raw[e.start:e.start + 1]!r}); save the file as UTF-8") from e
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path} line {line_no}: not valid JSON ({e.msg})") from e
            if not isinstance(record, dict) or any(k not in record for k in required):
                raise DatasetError(f"{path} line {line_no}: expected an object with "
                                   f"{' and '.join(repr(k) for k in required)}")
            yield line_no, record


def resolve_image_path(raw: str, base: Path) -> Path | None:
    """An image path from a label file: absolute, or relative to the file's folder, else to the working directory."""
    path = Path(raw).expanduser()
    candidates = [path] if path.is_absolute() else [base / path, Path.cwd() / path]
    return next((c for c in candidates if c.is_file()), None)


def relative_name(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` (POSIX separators) when it lies inside it, else the path as given."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def template_problem(template: str) -> str | None:
    """Why a class-name template is not plain text with ``{c}`` fields (storage/naming.py)."""
    from clipcache.storage.naming import template_problem as problem

    return problem(template, ("c",))


@dataclass
class ClassPrompts:
    """Class names and ``{c}`` templates for one language, with where they came from."""

    classnames: list[str]
    templates: list[str]
    language: str = "en"
    source: str = ""

    def __post_init__(self) -> None:
        # str.format would follow attributes and indexes, and a stray field is a KeyError deep in encoding
        for template in self.templates:
            if (problem := template_problem(template)) is not None:
                raise DatasetError(f"{self.source or 'class prompts'}: the template {template!r} {problem}")

    def override(self, classnames: str | None, templates: str | None, dataset: str | None = None) -> ClassPrompts:
        """Replace class names and/or templates with the contents of files (validated). A file holding a JSON object
        applies only to the datasets named as its keys."""
        names = self.classnames
        if classnames and (given := read_text_list(classnames, "classnames", dataset)) is not None:
            names = given
            if len(names) != len(self.classnames):
                raise ConfigError(f"classnames: {classnames} has {len(names)} names, the dataset has "
                                  f"{len(self.classnames)} classes (labels index them in order)")
        temps = self.templates
        if templates and (given := read_text_list(templates, "templates", dataset)) is not None:
            temps = given
            for template in temps:
                if (problem := template_problem(template)) is not None:
                    raise ConfigError(f"templates: {templates}: the template {template!r} {problem}")
            bad = [t for t in temps if "{c}" not in t]
            if bad or not temps:
                raise ConfigError(f"templates: {templates} " + (f"has a template without {{c}}: {bad[0]!r}" if bad
                                                                else "is empty"))
        source = ", ".join(str(p) for p in (classnames, templates) if p) or self.source
        return ClassPrompts(names, temps, self.language, source)

    def prompts(self) -> list[str]:
        """Class-major prompt list: row ``c * len(templates) + t`` is ``templates[t].format(c=classnames[c])``."""
        return [t.format(c=c) for c in self.classnames for t in self.templates]

    @property
    def sha256(self) -> str:
        """Content hash of the class names and templates (what identifies prompts in results)."""
        from clipcache.storage.hashing import digest

        return digest({"classnames": self.classnames, "templates": self.templates})


@dataclass
class EvalDataset(ABC):
    """An indexed dataset. Subclasses fill ``labels`` (classification) or ``captions`` (retrieval) while indexing."""

    name: str
    split: str
    task: Task
    labels: np.ndarray | None = None  # (n,) int64 class ids, or (n, C) multi-hot for multilabel datasets
    captions: list[list[str]] | None = None  # per sample, for retrieval
    prompts: ClassPrompts | None = None
    multilabel: bool = False
    languages: tuple[str, ...] = ("en",)  # the languages its captions / class names exist in

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        """Everything that determines the samples' content (a content fingerprint for local files)."""

    def image_identity(self, memo: FileHashMemo) -> dict[str, Any]:
        """What determines the images alone (the image entry's key). A dataset whose captions or annotations can
        change without its images changing (a caption file per language) narrows this, so every language shares
        one image entry."""
        return self.identity(memo)

    @abstractmethod
    def describe(self, index: int) -> str:
        """Where sample ``index`` comes from, for error messages (file, shard and member...)."""

    def sample_key(self, index: int) -> str | None:
        """Sample ``index``'s own name, stored with its per-sample result rows: its file (relative to the dataset's
        folder) or its shard and webdataset key; None where the dataset has none (generated or packed images)."""
        return None

    @abstractmethod
    def read_image_bytes(self, index: int) -> bytes | Image.Image:
        """Raw encoded image (or an already built PIL image for generated data)."""

    def load_image(self, index: int) -> Image.Image:
        """Decoded RGB image; a file that does not decode, or a decompression bomb, raises DatasetError naming it
        (tasks/datasets/image_bytes.py)."""
        raw = self.read_image_bytes(index)
        if isinstance(raw, Image.Image):
            return raw.convert("RGB")
        with opened_image(raw, lambda: self.describe(index)) as img:  # PIL refuses a bomb from its header
            img.load()
            return img.convert("RGB")

    def supports(self, task: Task) -> bool:
        return task == self.task
