"""Evaluation tasks in a registry (extended by other packages through the entry point group ``clipcache.tasks``).

CLI choices, parameter validation, the catalog and ``rescore``'s "must be cached" check all come from here; every
task runs through the same flow path (prepare, encode, score, write). See tasks/evaluation/base.py for the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import ClipcacheError, ConfigError
from clipcache.tasks.evaluation.base import (
    DataSource,
    EncodeSession,
    EncodeSettings,
    EvalTask,
    MetricInfo,
    PromptSettings,
    Scored,
    ScoreSettings,
    TaskOptions,
)
from clipcache.tasks.registry import Registry

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.progress import StageProgress

TASKS: Registry[EvalTask] = Registry("task", ConfigError, entry_point_group="clipcache.tasks")
TASKS.register("zeroshot_classification", "clipcache.tasks.evaluation.zeroshot_classification:ZeroShotClassification")
TASKS.register("zeroshot_retrieval", "clipcache.tasks.evaluation.zeroshot_retrieval:ZeroShotRetrieval")
TASKS.register("text_retrieval", "clipcache.tasks.evaluation.text_retrieval:TextRetrieval")
TASKS.register("linear_probe", "clipcache.tasks.evaluation.linear_probe:LinearProbe")
TASKS.register("image_clustering", "clipcache.tasks.evaluation.image_clustering:ImageClustering")
TASKS.register("any2any_retrieval", "clipcache.tasks.evaluation.any2any_retrieval:Any2AnyRetrieval")
TASKS.register("image_caption_selection",
               "clipcache.tasks.evaluation.image_caption_selection:ImageCaptionSelection")
TASKS.register("visual_sts", "clipcache.tasks.evaluation.visual_sts:VisualSts")
TASKS.register("multiple_choice", "clipcache.tasks.evaluation.multiple_choice:MultipleChoice")
TASKS.register("mieb", "clipcache.tasks.evaluation.mieb_runner:MiebTask")
TASKS.register("mieb_linear_probe", "clipcache.tasks.evaluation.mieb_linear_probe:MiebLinearProbe")
TASKS.register("knn_classification", "clipcache.tasks.evaluation.knn_classification:KnnClassification")
TASKS.register("face_attributes", "clipcache.tasks.evaluation.face_attributes:FaceAttributes")
TASKS.register("multilabel_probe", "clipcache.tasks.evaluation.multilabel_probe:MultilabelProbe")
TASKS.register("composed_retrieval", "clipcache.tasks.evaluation.composed_retrieval:ComposedRetrieval")
TASKS.register("visual_document_retrieval",
               "clipcache.tasks.evaluation.visual_document_retrieval:VisualDocumentRetrieval")
TASKS.register("winogavil", "clipcache.tasks.evaluation.winogavil:Winogavil")  # DataComp's misc/winogavil
TASKS.register("captioning", "clipcache.tasks.evaluation.captioning:Captioning")
# clipcache's own tasks, in the order their options are run parameters (flags, config keys; flows/config/task_params.py)
BUILTIN_TASKS: tuple[str, ...] = tuple(TASKS.in_order(plugins=False))


def get_task(name: str) -> EvalTask:
    """An instance of the task registered as ``name`` (registries hold classes: tasks are stateless)."""
    task = TASKS.get(name)
    return task() if isinstance(task, type) else task


def metric_declarations(names: Iterable[str] | None = None) -> list[tuple[str, MetricInfo]]:
    """(declarer, metric) of every metric a result may be named by: ``RUN_METRICS`` (declared by "every run") and
    the metrics each task of ``names`` (default: every registered one) declares. A plugin task that cannot be
    imported declares none (its own runs fail when they name it)."""
    from clipcache.tasks.evaluation.base import RUN_METRICS

    declared = [("every run", info) for info in RUN_METRICS]
    for name in TASKS.in_order() if names is None else names:  # registration order: definitions merge in it
        try:
            declared += [(name, info) for info in get_task(name).metrics]
        except ClipcacheError:
            continue
    return declared


def metric_catalog(names: Iterable[str] | None = None) -> dict[str, MetricInfo]:
    """Every metric a result of the tasks ``names`` (default: every registered task) may be named by, derived from
    the declarations (:func:`metric_declarations`). A name several tasks declare must agree on its direction and
    k (a ``ConfigError`` otherwise); its definitions are merged (``merge_declarations``)."""
    from clipcache.tasks.score.metrics import merge_declarations

    return {name: info for name, (info, _) in merge_declarations(metric_declarations(names)).items()}


def tasks_served(role: str, dataset_format: str, arrays: tuple[str, ...]) -> list[str]:
    """The registered tasks that read a cache entry with this role, dataset format and arrays (``cache ls``)."""
    from clipcache.tasks.evaluation.base import data_kind

    role = "prompt" if role == "prompt-batch" else role  # class prompts live in the model's pool, batch by batch
    kind = data_kind(role, dataset_format, arrays)
    return [name for name in TASKS.names() if get_task(name).serves(role, kind)]


def dbt_vars() -> dict[str, Any]:
    """What the dbt project needs to know about the tasks: their names and their main metrics (and the group
    metrics' definitions, from which the group marts are built)."""
    from clipcache.tasks.suites import groups

    tasks = [(name, get_task(name)) for name in TASKS.names()]
    return {"tasks": [name for name, _ in tasks],
            "main_metrics": [{"task": name, "metric": m, "k": k, "label": label, "priority": priority}
                             for name, task in tasks for m, k, label, priority in task.main_metrics],
            **groups.dbt_vars()}


def evaluate_one(task: str, session: EncodeSession, source: DataSource, store: EmbeddingStore, memo: FileHashMemo, *,
                 encode: EncodeSettings | None = None, score: ScoreSettings | None = None,
                 prompts: PromptSettings | None = None, options: TaskOptions | Mapping[str, Any] | None = None,
                 progress: StageProgress | None = None) -> Scored:
    """One task on one dataset with one model session, without a flow: prepare, encode what is missing, score.
    (What the pipeline does per pair, minus results files, but with their check that the metrics and sample rows
    are those the task declares; for scripts, benchmarks and tests.) ``options``: the
    task's options, as its ``Options`` model or a mapping of its fields (default: the settings' own, else the
    model's defaults)."""
    from clipcache.tasks.progress import StageProgress
    from clipcache.tasks.results import check_declared

    chosen = get_task(task)
    if options is not None:
        given = options if isinstance(options, TaskOptions) else chosen.Options.model_validate(dict(options))
        encode = replace(encode or EncodeSettings(), options=given)
        score = replace(score or ScoreSettings(), options=given)
    progress = progress or StageProgress(enabled=False)
    prepared = chosen.prepare(source, prompts or PromptSettings(), progress)
    encoded = chosen.encode(session, prepared, store, memo, encode or EncodeSettings(), progress)
    scored = chosen.score(store, encoded, prepared, score or ScoreSettings())
    check_declared(task, scored.metrics, scored.evidence)  # what a result of it would be refused for
    return scored
