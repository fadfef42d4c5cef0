"""Suites: named lists of datasets with, per dataset, its task, main metric and chance score (data, not code).

A suite is a YAML file (the shipped ones sit next to this module; a user's own is any path)::

    name: my_suite
    description: what it measures
    datasets:
      - dataset: vtab_caltech101        # a name `clipcache eval --dataset` accepts
        main_metric: mean_per_class_recall   # acc1, acc5, mean_per_class_recall, mean_recall@1, ndcg@10, ...
        chance: 0.009804                # the main metric of a random guess (for the normalised average)
        tags: [vtab_natural]

clip_benchmark's dataset collections (``vtab``, ``vtab+``, ``retrieval``, ``imagenet_robustness``, ``sugar_crepe``)
are suites too, made from tasks/datasets/clip_benchmark/collections.json with each task's usual main metric. The
score of a suite (tasks/suites/scoring.py) is the mean of the main metrics over all of its datasets, or a partial
score labelled so.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clipcache.storage.errors import ConfigError
from clipcache.tasks.datasets.record import TASK_MAIN_METRIC

HERE = Path(__file__).parent
# main metric of a dataset of a collection, by task: each task's usual one, as the dataset catalog's records say
DEFAULT_MAIN_METRIC = TASK_MAIN_METRIC
_MEAN_RECALL = re.compile(r"mean_recall@(\d+)$")
# A suite file is a list of datasets: the largest shipped one (mieb_lite, 130 datasets) is 17 KB. A bound keeps a
# wrong or hostile file (50 MB of YAML parses for minutes at gigabytes) to one line, read no further than the bound.
MAX_SUITE_BYTES = 1_000_000


class SuiteEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(min_length=1)
    name: str | None = None  # display name
    task: str = "auto"
    main_metric: str = "acc1"
    chance: float | None = Field(None, ge=0, lt=1)
    size: int | None = Field(None, ge=1)
    tags: list[str] = Field(default_factory=list)
    split: str = "test"
    language: str = "en"
    source_key: str | None = None  # the dataset's name in the suite's source (DataComp's ``vtab/caltech101``)
    runnable: bool = True  # false: clipcache has no reader for it yet; the suite stays partial without it
    note: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.dataset

    def metric_parts(self) -> list[tuple[str, int | None]]:
        """The (metric, k) rows of the warehouse whose mean is the main metric."""
        return metric_parts(self.main_metric)


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    source: str = ""
    datasets: list[SuiteEntry] = Field(min_length=1)
    groups: dict[str, list[str]] = Field(default_factory=dict)  # named subsets averaged on their own

    @field_validator("datasets")
    @classmethod
    def _unique(cls, entries: list[SuiteEntry]) -> list[SuiteEntry]:
        seen: set[tuple[str, str, str]] = set()
        for e in entries:
            key = (e.dataset, e.split, e.language)
            if key in seen:
                raise ValueError(f"{e.dataset} is listed twice")
            seen.add(key)
        return entries

    @model_validator(mode="after")
    def _groups_name_members(self) -> Suite:
        names = {e.dataset for e in self.datasets}
        for group, members in self.groups.items():
            unknown = [m for m in members if m not in names]
            if unknown:
                raise ValueError(f"group {group!r} names {', '.join(unknown)}, not datasets of the suite")
        return self

    def runnable(self) -> list[SuiteEntry]:
        return [e for e in self.datasets if e.runnable]


def metric_parts(main_metric: str) -> list[tuple[str, int | None]]:
    """``acc1`` -> [(acc, 1)], ``mean_recall@1`` -> both directions' recall@1, ``ndcg@10`` -> [(ndcg, 10)],
    ``mean_per_class_recall`` -> [(mean_per_class_recall, None)]. Any other name (DataComp's group metrics
    ``acc_wg``, ``F1-macro_all``, ...) is kept as it is and matches the metric rows of that name."""
    from clipcache.tasks.score.metrics import split_metric_name

    if m := _MEAN_RECALL.match(main_metric):
        at = int(m.group(1))
        return [("image_retrieval_recall", at), ("text_retrieval_recall", at)]
    try:
        from clipcache.tasks.evaluation import metric_catalog

        info, k = split_metric_name(main_metric, metric_catalog())
    except (KeyError, ValueError):
        return [(main_metric, None)]
    return [(info.name, k)]


def shipped() -> dict[str, Path | None]:
    """Suite name -> its file (None: made from a clip_benchmark collection)."""
    from clipcache.tasks.datasets.clip_benchmark.collections import dataset_collections

    files: dict[str, Path | None] = {p.stem: p for p in sorted(HERE.glob("*.yaml"))}
    return {**files, **{name: None for name in dataset_collections() if name not in files}}


def _one_line(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "suite"
    return f"{where}: {err['msg']}"


def parse_suite(data: object, origin: str) -> Suite:
    if not isinstance(data, dict):
        raise ConfigError(f"suite {origin}: expected a mapping with name and datasets")
    try:
        return Suite.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"suite {origin}: {_one_line(e)}") from None


def _collection_suite(name: str) -> Suite:
    from clipcache.tasks.datasets import default_task
    from clipcache.tasks.datasets.clip_benchmark.collections import canonical, dataset_collections

    chances = _known_chances()
    entries = []
    for member in dataset_collections()[name]:
        dataset = canonical(member)
        task = default_task(dataset, None)
        entries.append(SuiteEntry(dataset=dataset, task=task, main_metric=DEFAULT_MAIN_METRIC.get(task, "acc1"),
                                  chance=chances.get(dataset) if task == "zeroshot_classification" else None,
                                  source_key=member))
    return Suite(name=name, description=f"clip_benchmark's {name} collection",
                 source="LAION clip_benchmark (tasks/datasets/clip_benchmark/collections.json)", datasets=entries)


@cache
def _known_chances() -> dict[str, float]:
    """Chance scores of classification datasets as the shipped suites record them (top-1 accuracy)."""
    out: dict[str, float] = {}
    for path in sorted(HERE.glob("*.yaml")):
        for e in _read(path).datasets:
            if e.chance is not None and e.main_metric == "acc1":
                out.setdefault(e.dataset, e.chance)
    return out


def read_bounded_text(path: Path, limit: int, what: str, encoding: str = "utf-8") -> str:
    """The text of ``path``, or ConfigError naming ``what`` when it is larger than ``limit`` bytes (found by reading
    at most ``limit + 1`` bytes, so a huge or endless file costs nothing) or cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ConfigError(f"{what} {path}: larger than {limit:,} bytes; a file of this kind is far smaller (is "
                              f"it the right file?)")
        return data.decode(encoding)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path}: cannot read it ({str(e).splitlines()[0]})") from None


@cache
def _read(path: Path) -> Suite:
    import yaml

    text = read_bounded_text(path, MAX_SUITE_BYTES, "suite")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"suite {path}: cannot read it ({str(e).splitlines()[0]})") from None
    return parse_suite(data, str(path))


def load_suite(name_or_path: str) -> Suite:
    """A shipped suite by name, or a suite file."""
    known = shipped()
    if name_or_path in known:
        path = known[name_or_path]
        return _read(path) if path is not None else _collection_suite(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        return _read(path.resolve())
    raise ConfigError(f"suite: unknown suite {name_or_path!r} (shipped: {', '.join(known)}; or a .yaml file)")
