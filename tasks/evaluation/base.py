"""What an evaluation task is, and the typed requests the flow hands it.

A task (zero-shot classification, zero-shot retrieval, text retrieval, ...) declares what it reads from the cache
(``needs``: the roles of the entries it encodes) and the settings that change its numbers (``option_defaults``), and
implements three steps the flow runs for every (model, dataset, language):

- ``prepare``: open and index the data (cheap; no image is decoded), pick the prompts, check the data fits the task;
- ``encode``: make sure every entry it needs is in the cache (encoding only what is missing; with ``cached_only`` a
  missing entry is a :class:`CacheMissError`), and return small references to them;
- ``score``: metrics from the cache entries alone (no model, no image).

A new task is one module with one subclass, plus one line in ``clipcache.tasks.evaluation`` (or an entry point in the
group ``clipcache.tasks``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from clipcache.storage.errors import ClipcacheError

if TYPE_CHECKING:  # naming tasks and validating parameters must not import zarr, numpy or rich
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.progress import StageProgress


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

    def open(self, progress: StageProgress | None = None) -> Any:
        from clipcache.tasks.datasets import open_dataset

        return open_dataset(self.name, self.root, self.split, self.limit, hub=self.hub, cache_dir=self.data_dir,
                            offline=self.offline, progress=progress, language=self.language,
                            annotation_file=self.annotation_file)


@dataclass(frozen=True)
class EncodeSettings:
    batch_size: int = 64
    num_workers: int = 2
    on_bad_image: str = "error"
    cached_only: bool = False  # rescore: everything but never-seen class prompts must come from the cache
    train_split: str = "train"  # linear_probe: the split it learns from ...
    val_split: str | None = None  # ... and the one it picks its weight decay on


@dataclass(frozen=True)
class ScoreSettings:
    recall_k: tuple[int, ...] = (1, 5, 10)
    retrieval_metrics: tuple[str, ...] = ("recall",)
    ties: str = "topk"  # topk: what torch.topk keeps (clip_benchmark's numbers); stable: lowest index wins
    device: str = "cpu"
    batch_size: int = 64  # clip_benchmark computes logits per data-loader batch: same blocks, same bits
    # linear_probe (clip_benchmark's flags of the same names)
    train_split: str = "train"
    val_split: str | None = None
    val_proportion: float | None = None
    fewshot_k: int = -1
    fewshot_lr: float = 0.1
    fewshot_epochs: int = 10
    seed: int = 0


@dataclass(frozen=True)
class PromptSettings:
    language: str = "en"
    classnames: str | None = None  # files replacing the dataset's (a what-if)
    templates: str | None = None


@dataclass
class Prepared:
    """A dataset opened for one task, with what identifies it in results."""

    data: Any
    n_samples: int
    source: DataSource
    prompts: Any = None  # ClassPrompts for tasks that use them
    default_prompts: bool = True
    prompts_sha256: str | None = None


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


class EvalTask(ABC):
    name: ClassVar[str]
    short: ClassVar[str]  # the console's name for it
    description: ClassVar[str]
    needs: ClassVar[tuple[str, ...]]  # cache roles it reads: image, caption, prompt, corpus, query
    # the kinds of data its entries come from: classification, retrieval, selection, text, any2any (see data_kind)
    reads: ClassVar[tuple[str, ...]] = ()
    uses_prompts: ClassVar[bool] = False
    option_defaults: ClassVar[dict[str, Any]] = {}
    # The leaderboard's headline number: (metric, k, label, priority); the rows of the lowest priority present are
    # averaged (e.g. retrieval: image and text recall@5).
    main_metrics: ClassVar[tuple[tuple[str, int | None, str, int], ...]] = ()

    def serves(self, role: str, kind: str) -> bool:
        """Whether an entry of ``role`` encoded from data of ``kind`` is one this task reads."""
        return role in self.needs and kind in self.reads

    def options(self, settings: ScoreSettings) -> dict[str, Any]:
        """The settings that change this task's numbers and differ from their defaults (part of the experiment)."""
        values = {name: getattr(settings, name) for name in self.option_defaults}
        return {k: v for k, v in values.items() if v != self.option_defaults[k]}

    @abstractmethod
    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared: ...

    @abstractmethod
    def encode(self, session: Any, prepared: Prepared, store: EmbeddingStore, memo: FileHashMemo,
               settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        ...

    @abstractmethod
    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared, settings: ScoreSettings) -> Scored:
        ...
