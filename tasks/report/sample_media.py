"""What the comparison pages show of a dataset's samples: small JPEG thumbnails, class names and caption texts.

The dataset is opened the way its experiment's run opened it (the name, split, language and sample limit of its
metric rows; ``dataset_root``, hub, cache folder, annotation file and class-name files of the run's stored
configuration), through the same lookup as ``eval`` (``tasks/datasets``), but offline: a report never downloads a
dataset. When the data cannot be opened any more (moved, deleted, never downloaded here), the pages say why and
show indices in place of images and names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import ClipcacheError

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

THUMBNAIL_PX = 96


@dataclass
class DatasetView:
    """A dataset as the pages show it. ``dataset`` is None when it could not be opened (``problem`` says why)."""

    dataset: Any = None  # an EvalDataset
    classnames: list[str] | None = None
    captions: list[str] = field(default_factory=list)  # every caption, in the dataset's caption order
    caption_image: list[int] = field(default_factory=list)  # the image each caption describes
    problem: str | None = None

    def class_name(self, index: int | None) -> str:
        if index is None:
            return "–"
        if self.classnames is not None and 0 <= index < len(self.classnames):
            return self.classnames[index]
        return f"class {index}"

    def caption(self, index: int) -> str:
        return self.captions[index] if 0 <= index < len(self.captions) else f"caption {index}"


def experiment_source(con: DuckDBPyConnection, experiment_id: str) -> dict[str, Any]:
    """The experiment's dataset identity (metric rows) and its latest run's stored configuration."""
    row = con.execute("SELECT m.dataset, m.split, m.language, m.sample_limit, m.default_prompts, r.config "
                      "FROM metrics m JOIN runs r USING (run_id) WHERE m.experiment_id = ? "
                      "ORDER BY m.created_at DESC, m.run_id DESC LIMIT 1", [experiment_id]).fetchone()
    if row is None:
        return {}
    dataset, split, language, limit, default_prompts, config = row
    try:
        stored = json.loads(config or "{}")
    except json.JSONDecodeError:
        stored = {}
    return {"dataset": dataset, "split": split, "language": language, "limit": limit,
            "default_prompts": default_prompts, "config": stored if isinstance(stored, dict) else {}}


def open_view(source: dict[str, Any]) -> DatasetView:
    """Open the dataset ``experiment_source`` describes (offline), with its class names and captions."""
    from clipcache.storage.paths import local_dir
    from clipcache.tasks.contract import DataSource, PromptSettings

    if not source:
        return DatasetView(problem="the experiment has no metric rows")
    config = source["config"]
    cache_dir = config.get("cache_dir")
    data = DataSource(source["dataset"], config.get("dataset_root"), split=source["split"], limit=source["limit"],
                      hub=config.get("hub") or "huggingface", data_dir=str(local_dir(cache_dir)) if cache_dir else None,
                      offline=True, language=source["language"], annotation_file=config.get("annotation_file"))
    try:
        dataset = data.open()
    except ClipcacheError as e:
        return DatasetView(problem=f"the dataset could not be opened here ({e})")
    view = DatasetView(dataset)
    if dataset.captions is not None:
        for image, texts in enumerate(dataset.captions):
            view.captions += texts
            view.caption_image += [image] * len(texts)
    if dataset.prompts is not None:
        from clipcache.tasks.evaluation.common import class_prompts

        settings = PromptSettings(language=source["language"], classnames=config.get("classnames"),
                                  templates=config.get("templates"))
        try:
            view.classnames = list(class_prompts(dataset, settings)[0].classnames)
        except ClipcacheError as e:  # a class-name file of a what-if that is gone: indices, not wrong names
            view.problem = f"class names unavailable ({e})"
    return view


def write_thumbnail(view: DatasetView, index: int, path: Path, size: int = THUMBNAIL_PX) -> bool:
    """Sample ``index``'s image as a JPEG of at most ``size`` px a side at ``path``; False when there is none."""
    if view.dataset is None or not 0 <= index < len(view.dataset):
        return False
    try:
        image = view.dataset.load_image(index)
    except ClipcacheError:
        return False  # undecodable: the run skipped or refused it too
    image.thumbnail((size, size))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, "JPEG", quality=85)
    return True
