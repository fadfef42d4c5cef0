"""Any MIEB task by its mteb name: ``--dataset mieb:CIFAR10ZeroShot`` runs mteb 2.x's own task object (its data
loading, dataset transform, evaluator and metrics) with a clipcache model behind mteb's encoder protocol, so every
image and text goes through the embedding cache (tasks/encode/mteb_encoder.py) and a re-run does no forward pass.

Data: with ``--dataset_root`` (a folder, or a template with ``{dataset}``, the mteb task name), mteb loads the
local copy exactly as it loads the hub repository: a snapshot of the dataset repository (``hf download mteb/cifar10
--repo-type dataset --local-dir DIR``: Parquet files, and for retrieval tasks the README's ``configs``), which
``datasets.load_dataset`` reads from the folder in place of the hub; or a ``datasets`` ``save_to_disk`` folder of a
task that loads one dataset (not retrieval). Without a root, mteb downloads from the hub; an unreachable hub is one
line saying what to fetch.

Experiment: dataset ``mieb:<task>``, task ``mieb``; its ``prompts`` identity is the digest of the mteb task's
definition (name, dataset path and revision, hf subset, mteb major.minor), so a new mteb release or dataset
revision is a new experiment. Metrics: every number mteb reports for the split and subset, as ``mteb_<name>`` (``k``
split off ``..._at_<k>``), ``mteb_main_score`` being the task's main score (the leaderboard's number).

mteb's evaluators interleave encoding and scoring, so the encode step runs mteb's evaluation (a cheap pass over
cached vectors once they are cached) and the score step reports its numbers; a rescore (``cached_only``) runs it
again with the cache alone and fails with CacheMissError where a vector is missing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from clipcache.storage.errors import ConfigError
from clipcache.tasks.datasets.mieb.mieb_tasks import NAME, MiebData, load_mieb, task_name
from clipcache.tasks.datasets.source import format_root
from clipcache.tasks.evaluation.base import (
    DataSource,
    Encoded,
    EncodeSession,
    EncodeSettings,
    EvalTask,
    Prepared,
    PromptSettings,
    Scored,
    ScoreSettings,
)

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.mieb.mieb_tasks import MiebData
    from clipcache.tasks.progress import StageProgress

METRIC_PREFIX = "mteb_"


@dataclass(frozen=True)
class MiebOutcome:
    """What the mteb run read from and added to the cache (an ``Encoded`` outcome)."""

    keys: list[str] = field(default_factory=list)
    encoded: int = 0
    cached: int = 0

    @property
    def cache_hit(self) -> bool:
        return self.encoded == 0


def scores_as_metrics(scores: dict[str, Any]) -> dict[str, float]:
    """mteb's score dict for one split and subset as clipcache metrics: ``mteb_<name>``; nested dicts joined by
    ``_``; None (a score mteb leaves undefined) kept as NaN, written as null."""
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}_{_clean(str(k))}", v)
        elif isinstance(value, bool):
            out[prefix] = float(value)
        elif isinstance(value, int | float):
            out[prefix] = float(value)
        elif value is None:
            out[prefix] = float("nan")

    for key, value in scores.items():
        if key not in ("hf_subset", "languages"):
            walk(METRIC_PREFIX + _clean(key), value)
    return out


def _clean(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key.lower()).strip("_")


class MiebTask(EvalTask["MiebData"]):
    name = NAME
    short = "mieb"
    description = "any MIEB task by its mteb name (mieb:<task>): mteb's own task and evaluator over cached vectors"
    needs = ("mieb_image", "prompt")
    mteb_roles = True
    main_metrics = (("mteb_main_score", None, "main_score", 1),)

    def serves(self, role: str, kind: str) -> bool:
        return role in ("mieb_image-batch", "prompt")  # texts live in the model's text pool, shared with prompts

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[MiebData]:
        from clipcache.storage.hashing import digest

        name = task_name(source.name)
        if source.limit is not None:
            raise ConfigError(f"mieb:{name}: --limit does not apply; mteb evaluates its task's whole split")
        root = format_root(source.root, name) if source.root else None
        cache = source.data_dir  # datasets' Arrow copy under --cache_dir (a temporary folder when it is remote)
        hf_cache = Path(cache) / "hf_datasets" if cache and "://" not in cache else None
        with progress.status(f"loading mieb:{name}"):
            data = load_mieb(name, root, source.split, source.language, hf_cache)
        return Prepared(data, data.n_samples, source, prompts_sha256=digest(data.identity), default_prompts=True)

    def encode(self, session: EncodeSession, prepared: Prepared[MiebData], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        import mteb

        from clipcache.tasks.encode.mteb_encoder import CachedMtebEncoder

        started = time.perf_counter()
        data: MiebData = prepared.data
        encoder = CachedMtebEncoder(session, store, batch_size=settings.batch_size,
                                    cached_only=settings.cached_only, progress=progress)
        with progress.status(f"mteb evaluating {data.name}"):
            # the encoder has mteb's encode and similarity; its constructor is not the protocol's (mteb does not build it)
            result = mteb.evaluate(cast("Any", encoder), data.task, cache=None, co2_tracker=False, raise_error=True,
                                   encode_kwargs={"batch_size": settings.batch_size}, show_progress_bar=False,
                                   overwrite_strategy="always")
        [task_result] = result.task_results
        [scores] = [s for s in task_result.scores[data.split] if s.get("hf_subset") == data.subset]
        counts = encoder.counts
        outcomes = {"mieb_image": MiebOutcome(counts.image_keys, counts.images_encoded, counts.images_cached),
                    "prompt": MiebOutcome(counts.text_keys, counts.texts_encoded, counts.texts_cached)}
        info = {"scores": dict(scores), "mteb_version": task_result.mteb_version,
                "dataset_revision": task_result.dataset_revision}
        return Encoded(outcomes, info, seconds=time.perf_counter() - started)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[MiebData],
              settings: ScoreSettings) -> Scored:
        return Scored(scores_as_metrics(encoded.info["scores"]), prepared.n_samples)


