"""The typed contract below the tasks: what the flow hands a stage, and what a stage hands back.

The encode and score stages, the evaluation tasks and the flows import these types from here, downward; nothing
here imports a stage when it runs (the payloads' types are named for the type checker only).
``clipcache.tasks.evaluation.base`` re-exports them beside ``EvalTask``. Naming and validating import this module, so
it stays light: no numpy, torch or zarr.

A task is generic over what its ``prepare`` opens (``Prepared[DataT]``: an ``EvalDataset``, a BEIR folder's
``BeirData``, ...), and every task encodes through the same :class:`EncodeSession` (a protocol: what the tasks and
the encode stage read from a model session; ``tasks/encode/stage.py``'s ``ModelSession`` is the one the flows make).

Each task's settings that change its numbers are a :class:`TaskOptions` model of its own (``EvalTask.Options``); the
shared settings (batch size, k values, device) are plain fields of :class:`EncodeSettings` and
:class:`ScoreSettings`, which carry the task's options to it. The per-sample rows a task keeps are declared as
:class:`SampleUnit` records (``EvalTask.samples``), and the results writer holds its ``Evidence`` to them.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from clipcache.storage.errors import ClipcacheError

if TYPE_CHECKING:  # naming tasks and validating parameters must not import rich, numpy or torch
    import torch

    from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset
    from clipcache.tasks.models.base import EmbeddingModel
    from clipcache.tasks.models.loader import ResolvedModel
    from clipcache.tasks.progress import StageProgress
    from clipcache.tasks.score.evidence import Evidence

BATCH_SIZE = 64  # clip_benchmark's --batch_size: images or texts per forward pass, and logits per scoring block
Ties = Literal["topk", "stable"]
OnBadImage = Literal["error", "skip"]
DecodeMode = Literal["cpu", "gpu"]  # where images are decoded and preprocessed (gpu: nvJPEG, its own cache identity)
DecodePoolKind = Literal["auto", "processes", "threads"]  # what decodes on the CPU (tasks/encode/batches.py)


class CacheMissError(ClipcacheError):
    """``rescore`` needs embeddings that are not in the cache."""

    def __init__(self, missing: list[str]):
        self.missing = missing
        super().__init__("not in the cache: " + "; ".join(missing))


@dataclass(frozen=True)
class DataSource:
    """Where a dataset comes from: everything needed to open it, here or on a worker."""

    name: str
    root: str | None = None  # --dataset_root (a folder or a template with {dataset} / {dataset_cleaned})
    split: str = "test"
    limit: int | None = None
    hub: str = "huggingface"
    data_dir: str | None = None  # local folder that hub downloads go to
    offline: bool = False
    language: str = "en"  # readers whose files differ by language (flickr30k_test_zh.txt) read that language's
    annotation_file: str | None = None  # a caption dataset's annotation file in place of its default one

    def open(self, progress: StageProgress | None = None) -> EvalDataset:
        from clipcache.tasks.datasets import open_dataset

        return open_dataset(self.name, self.root, self.split, self.limit, hub=self.hub, cache_dir=self.data_dir,
                            offline=self.offline, progress=progress, language=self.language,
                            annotation_file=self.annotation_file)


class TaskOptions(BaseModel):
    """The settings that change one task's numbers: each task declares its own as a subclass (``EvalTask.Options``),
    and each default is written there only. The CLI flags, their validation, the experiment's options (the values
    that differ from these defaults) and the rescore hint are derived from the model. A task without options has
    this empty one.

    Each field is also a run parameter (a flag, a config key, a deployment parameter) named as the field: options of
    several tasks that share a name share the parameter and must be declared alike (flows/config/task_params.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the options its encode step reads (they choose which cache entries exist: a rescore's hint names them)
    encode_fields: ClassVar[tuple[str, ...]] = ()
    # the options a run may give several values of, one experiment per value (name -> what several values give)
    swept: ClassVar[dict[str, str]] = {}

    @classmethod
    def of(cls, settings: EncodeSettings | ScoreSettings) -> Self:
        """The options ``settings`` carry for this task: its defaults when they carry none."""
        given = settings.options
        if given is None:
            return cls()
        if type(given) is not cls:  # another task's options would make another task's experiment
            raise TypeError(f"{cls.__qualname__} expected, the settings carry {type(given).__qualname__}")
        return given

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults: part of the experiment's identity."""
        return self.model_dump(exclude_defaults=True)


class SeededOptions(TaskOptions):
    """Options of a task that draws random numbers: one seed for all of them."""

    seed: int = Field(0, description="the seed of every random choice the task makes")


# The sample rows' columns the writer fills itself (storage/results.py: write_sample_rows): no task declares them.
# ``sample_index`` (the position in the dataset's order) and ``sample_key`` (its own name) every unit may carry.
WRITER_COLUMNS = frozenset({"run_id", "created_at", "experiment_id", "task", "unit", "schema_version"})


@dataclass(frozen=True)
class SampleUnit:
    """One kind of per-sample row a task writes to the warehouse's ``samples`` table (``EvalTask.samples``): the
    ``unit`` it is written as (a name, or a pattern whose ``<placeholder>`` stands for a word: ``caption_<metric>``),
    the columns of ``SAMPLE_SCHEMA`` (storage/results.py) its rows fill besides ``sample_index`` and
    ``sample_key``, and what a row is. A row's columns not filled are null. ``recomputes``: which of the task's
    metrics the unit's rows recompute, and how (docs/results.md's table; tests/test_evidence_*.py recompute them)."""

    unit: str
    columns: tuple[str, ...]
    meaning: str
    recomputes: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]*(<[a-z_]+>[a-z0-9_]*)?", self.unit) or not self.unit:
            raise TypeError(f"SampleUnit {self.unit!r}: a unit is a lower-case name, with at most one <placeholder>")
        if not isinstance(self.columns, tuple):
            raise TypeError(f"SampleUnit {self.unit!r}: columns is a tuple of the sample rows' column names")

    def matches(self, unit: str) -> bool:
        head, _, rest = self.unit.partition("<")
        if not rest:
            return unit == self.unit
        tail = rest.partition(">")[2]
        return re.fullmatch(re.escape(head) + "[A-Za-z0-9_.:-]+" + re.escape(tail), unit) is not None


def sample_rows_problem(task: str, declared: tuple[SampleUnit, ...], parts: Iterable[tuple[str, Iterable[str]]],
                        schema_columns: Collection[str]) -> str | None:
    """Why rows of (unit, columns) ``parts`` are not what ``task`` declares (``EvalTask.samples``) and
    ``SAMPLE_SCHEMA`` (``schema_columns``) holds, in one line; None when they are."""
    for spec in declared:
        if unknown := [c for c in spec.columns if c not in schema_columns]:
            return (f"task {task} declares sample unit {spec.unit!r} with column(s) {', '.join(unknown)} that the "
                    f"sample rows do not have (SAMPLE_SCHEMA, storage/results.py)")
        if fixed := [c for c in spec.columns if c in WRITER_COLUMNS]:
            return (f"task {task} declares sample unit {spec.unit!r} with column(s) {', '.join(fixed)} that the "
                    f"results writer fills itself")
    for unit, columns in parts:
        found = next((s for s in declared if s.matches(unit)), None)
        if found is None:
            return (f"task {task} wrote sample rows of unit {unit!r} it does not declare (EvalTask.samples: "
                    f"{', '.join(s.unit for s in declared) or 'none'})")
        if extra := [c for c in columns if c not in (*found.columns, "sample_index")]:
            return (f"task {task} wrote column(s) {', '.join(extra)} in sample rows of unit {unit!r}, which declares "
                    f"{', '.join(found.columns) or 'none'} (EvalTask.samples)")
    return None


@dataclass(frozen=True)
class EncodeSettings:
    batch_size: int = BATCH_SIZE
    num_workers: int | None = None  # image-decoding processes or threads; None: the cores available
    on_bad_image: OnBadImage = "error"
    cached_only: bool = False  # rescore: everything but never-seen class prompts must come from the cache
    options: TaskOptions | None = None  # the task's options (TaskOptions.of); linear_probe's choose its splits
    decode_pool: DecodePoolKind = "auto"  # never changes a vector: processes and threads decode alike
    prefetch: int = 2  # batches in flight per decoding worker (DataLoader's prefetch_factor); never changes a vector


@dataclass(frozen=True)
class ScoreSettings:
    recall_k: tuple[int, ...] = (1, 5, 10)
    retrieval_metrics: tuple[str, ...] = ("recall",)
    device: str = "cpu"
    batch_size: int = BATCH_SIZE  # clip_benchmark computes logits per data-loader batch: same blocks, same bits
    options: TaskOptions | None = None  # the task's options (TaskOptions.of); None: its defaults
    bootstrap: int = 1000  # resamples of the metrics' 95% intervals (0: none); not part of an experiment's identity


@dataclass(frozen=True)
class PromptSettings:
    language: str = "en"
    classnames: str | None = None  # files replacing the dataset's (a what-if)
    templates: str | None = None


class EncodeSession(Protocol):
    """What a task and the encode stage read from a model session: the resolved model (its identity goes into every
    cache key), where and how it runs, and the model itself (loaded on first use). ``tasks/encode/stage.py``'s
    ``ModelSession`` is the one the flows make; a task never needs more than this."""

    @property
    def resolved(self) -> ResolvedModel: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def amp(self) -> bool: ...

    @property
    def precision(self) -> str: ...  # part of every cache key

    @property
    def decode(self) -> str: ...  # where images are decoded (DecodeMode): gpu is another preprocessing, keyed apart

    @property
    def model(self) -> EmbeddingModel: ...  # loads the weights on first use


DataT = TypeVar("DataT")  # what a task's prepare opened (EvalDataset, BeirData, ...)


@dataclass
class Prepared(Generic[DataT]):
    """A dataset opened for one task, with what identifies it in results."""

    data: DataT
    n_samples: int
    source: DataSource
    prompts: ClassPrompts | None = None  # for tasks that use them
    default_prompts: bool = True
    prompts_sha256: str | None = None

    def class_prompts(self) -> ClassPrompts:
        """The class prompts ``prepare`` chose, for a task that uses them (``uses_prompts``)."""
        if self.prompts is None:  # a bug, not bad input: such a task's prepare always chooses them
            raise TypeError(f"{self.source.name}: prepared without class prompts")
        return self.prompts


@dataclass
class Encoded:
    """References to the cache entries one evaluation needs (small; no arrays)."""

    outcomes: dict[str, Any] = field(default_factory=dict)  # role -> EncodeOutcome / PromptOutcome
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def cache_hit(self) -> bool:
        return all(o.cache_hit for o in self.outcomes.values())

    @property
    def resumed(self) -> bool:
        return any(getattr(o, "resumed", False) for o in self.outcomes.values())

    @property
    def cache_keys(self) -> list[str]:
        return [key for o in self.outcomes.values() for key in o.keys]


@dataclass
class Scored:
    metrics: dict[str, float]
    n_samples: int
    tied: dict[str, int] = field(default_factory=dict)  # flat metric name -> tie-sensitive queries
    seconds: float = 0.0
    evidence: Evidence | None = None  # per-sample outcomes and intervals (tasks that keep them)
