"""What an evaluation task is. The typed requests the flow hands it live in ``clipcache.tasks.contract``, below the
stages, and are re-exported here.

A task (zero-shot classification, zero-shot retrieval, text retrieval, ...) declares what it reads from the cache
(``needs``: the roles of the entries it encodes), the settings that change its numbers (``Options``, a pydantic
model: each default is written there once; the run parameters and CLI flags derive from it), every metric it
reports (``metrics``: name, direction, definition; those it shares with other tasks too) and the per-sample rows it
keeps (``samples``: each unit with its columns and meaning; the results writer refuses others). Its scorer is its
``score``. It implements three steps the flow runs for every (model, dataset, language):

- ``prepare``: open and index the data (cheap; no image is decoded), pick the prompts, check the data fits the task;
- ``encode``: make sure every entry it needs is in the cache (encoding only what is missing; with ``cached_only`` a
  missing entry is a :class:`CacheMissError`), and return small references to them;
- ``score``: metrics from the cache entries alone (no model, no image).

``EvalTask`` is generic over what ``prepare`` opens (``EvalTask[EvalDataset]``: ``Prepared[EvalDataset]`` is what its
``encode`` and ``score`` receive), and ``encode`` gets the model through the :class:`EncodeSession` protocol. The
tasks that learn from or cluster a classification dataset's cached image features share ``prepare`` and ``encode``
in ``clipcache.tasks.evaluation.probes``.

A new task is one module with one subclass, plus one line in ``clipcache.tasks.evaluation`` (or an entry point in the
group ``clipcache.tasks``): its options become flags and its metrics enter the catalog from there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Generic

from clipcache.tasks.contract import (
    CacheMissError,
    DataSource,
    DataT,
    Encoded,
    EncodeSession,
    EncodeSettings,
    Prepared,
    PromptSettings,
    SampleUnit,
    Scored,
    ScoreSettings,
    SeededOptions,
    TaskOptions,
)
from clipcache.tasks.score.metrics import MetricInfo

# The shared types live in clipcache.tasks.contract (below the stages); they are re-exported here for the code,
# docs and plugins that import them from this module.
__all__ = ["CacheMissError", "DataSource", "DataT", "EncodeSession", "EncodeSettings", "Encoded", "EvalTask",
           "MetricInfo", "Prepared", "PromptSettings", "RUN_METRICS", "SampleUnit", "ScoreSettings", "Scored",
           "SeededOptions", "TaskOptions", "data_kind"]

if TYPE_CHECKING:  # naming tasks and validating parameters must not import zarr, numpy or rich
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.progress import StageProgress


# The metrics a run of any task may report beside its task's own: the catalog holds them for every task.
RUN_METRICS = (MetricInfo("skipped_images", False, False, "images left out as undecodable (--on_bad_image skip)"),)


def data_kind(role: str, dataset_format: str, arrays: tuple[str, ...]) -> str:
    """The kind of data a cache entry was encoded from, from what the entry records: its role, its dataset's
    format, and its arrays (a classification dataset's image entries carry ``target``)."""
    if role == "prompt":
        return "classification"
    if role in ("corpus", "query"):
        return "text"
    if role.startswith(("corpus_", "query_")):
        return "any2any"
    if dataset_format.startswith("selection"):
        return "selection"
    return "classification" if "target" in arrays else "retrieval"


class EvalTask(ABC, Generic[DataT]):
    name: ClassVar[str]
    short: ClassVar[str]  # the console's name for it
    description: ClassVar[str]
    needs: ClassVar[tuple[str, ...]]  # cache roles it reads: image, caption, prompt, corpus, query
    # the kinds of data its entries come from: classification, retrieval, selection, text, any2any (see data_kind)
    reads: ClassVar[tuple[str, ...]] = ()
    uses_prompts: ClassVar[bool] = False
    # mteb hands its texts over with their prompt_type (mieb:), so a model that embeds queries otherwise than
    # documents gets a retrieval task's queries as queries (tasks/identity.py: roles_option)
    mteb_roles: ClassVar[bool] = False
    # The settings that change its numbers (a subclass declares its own model; see TaskOptions). Flags, validation,
    # the experiment's options and the rescore hint derive from it.
    Options: ClassVar[type[TaskOptions]] = TaskOptions
    # The metrics its scores are named by (name, direction, definition), every one it reports but RUN_METRICS: the
    # results' metric catalog is these, for every registered task (a name several tasks declare has one direction
    # and one k; their definitions are merged, see clipcache.tasks.score.metrics.merge_declarations).
    metrics: ClassVar[tuple[MetricInfo, ...]] = ()
    # The per-sample rows its Scored.evidence holds, one SampleUnit per unit (name, columns, meaning): the results
    # writer refuses rows of another unit or column, and docs/results.md's table of units is generated from these.
    samples: ClassVar[tuple[SampleUnit, ...]] = ()
    # The leaderboard's headline number: (metric, k, label, priority); the rows of the lowest priority present are
    # averaged (e.g. retrieval: image and text recall@5).
    main_metrics: ClassVar[tuple[tuple[str, int | None, str, int], ...]] = ()

    def serves(self, role: str, kind: str) -> bool:
        """Whether an entry of ``role`` encoded from data of ``kind`` is one this task reads."""
        return role in self.needs and kind in self.reads

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "option_defaults" in cls.__dict__:  # ignoring it would drop the options from the experiment's identity
            raise TypeError(f"{cls.__qualname__}.option_defaults: declare the options as a pydantic model instead "
                            f"(class Options(TaskOptions), see clipcache.tasks.contract)")

    def options(self, settings: EncodeSettings | ScoreSettings) -> dict[str, Any]:
        """The settings that change this task's numbers and differ from their defaults (part of the experiment)."""
        return self.Options.of(settings).changed()

    @abstractmethod
    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[DataT]: ...

    @abstractmethod
    def encode(self, session: EncodeSession, prepared: Prepared[DataT], store: EmbeddingStore, memo: FileHashMemo,
               settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        ...

    @abstractmethod
    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[DataT],
              settings: ScoreSettings) -> Scored:
        ...
