"""Results in mteb's results-folder layout, for the datasets that have a MIEB counterpart.

mteb (2.x) keeps results as ``<cache>/results/<model name, "/" as "__">/<revision>/<TaskName>.json`` (a
``TaskResult``: ``task_name``, ``dataset_revision``, ``mteb_version``, ``scores: {split: [{main_score, <main score
field>, hf_subset, languages}]}``, ...) beside a ``model_meta.json`` (``name``, ``revision``, ...). ``mteb.ResultCache
(<cache>).load_results(include_remote=False)`` and ``mteb.TaskResult.from_disk`` read what :func:`write_mteb_results`
writes, with ``main_score`` equal to our value.

Which dataset is which MIEB task is data (tasks/suites/mieb_tasks.json): per MIEB task, its main score field, split,
dataset revision and hf_subsets as mteb's TaskMetadata declares them, the clipcache task and metric whose value is
that main score, and the clip_benchmark datasets whose result on a split IS that number (``cifar10`` zero-shot top-1
accuracy on test is ``CIFAR10ZeroShot``'s ``accuracy``). Only a result of the mapped clipcache task counts: a linear
probe of ``cifar10`` is never written as ``CIFAR10ZeroShot``. A dataset named ``mieb:<TaskName>`` is that task, run by
mteb's own evaluator (tasks/evaluation/mieb_runner.py: task ``mieb``, metric ``mteb_main_score``).
mteb itself is not needed to write the files (it is a test dependency: the tests read them back with it).

Each score is filed under the split and hf subset its result was evaluated on, read from the result row: a
``mieb:<TaskName>`` result keeps its own split (a task with dev and test results gets both) and language (the
hf subset of a multilingual task); a clip_benchmark dataset's result is filed under the MIEB split its (dataset,
split) pair stands for in the table (``food101`` test is Food101ZeroShot's ``validation``: another name for the
same data, not a guess).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.storage.errors import ConfigError
from clipcache.tasks.suites import HERE, Suite, SuiteEntry, metric_parts
from clipcache.tasks.suites.scoring import ModelScore

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

MIEB_PREFIX = "mieb:"
# what the mieb runner (tasks/evaluation/mieb_runner.py) records for a mieb:<TaskName> dataset: mteb's own main score
RUNNER = ("mieb", "mteb_main_score")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@-]")


@dataclass(frozen=True)
class MiebTask:
    name: str
    type: str
    main_score: str  # the field of mteb's scores dict that is the task's main score
    split: str  # MIEB's evaluation split
    revision: str  # the dataset revision mteb records
    subsets: dict[str, list[str]]  # hf_subset -> languages (ISO 639-3 + script)
    task: str | None  # the clipcache task whose metric is the main score (None: clipcache computes none)
    metric: str | None  # its main metric name as suites write it (acc1, ndcg@10, ...)
    datasets: tuple[tuple[str, str], ...]  # (clipcache dataset, its split) whose result is this task's number


@cache
def mieb_tasks() -> dict[str, MiebTask]:
    data = json.loads((HERE / "mieb_tasks.json").read_text(encoding="utf-8"))
    return {name: MiebTask(name, e["type"], e["main_score"], e["split"], e["revision"], e["subsets"], e["task"],
                           e["metric"], tuple((d["dataset"], d["split"]) for d in e.get("datasets", ())))
            for name, e in data["tasks"].items()}


def mteb_version() -> str:
    """The mteb release whose task metadata the mapping mirrors (written as the results' format version)."""
    return str(json.loads((HERE / "mieb_tasks.json").read_text(encoding="utf-8"))["mteb_version"])


def mieb_counterpart(dataset: str, split: str) -> MiebTask | None:
    """The MIEB task a dataset's result is, or None. ``mieb:<TaskName>`` names one (an unknown name is an error)."""
    tasks = mieb_tasks()
    if dataset.startswith(MIEB_PREFIX):
        name = dataset[len(MIEB_PREFIX):]
        if name not in tasks:
            raise ConfigError(f"dataset {dataset}: {name!r} is not a MIEB task of mteb {mteb_version()} "
                              f"(tasks/suites/mieb_tasks.json)")
        return tasks[name]
    return next((t for t in tasks.values() if (dataset, split) in t.datasets), None)


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)


def model_name_and_revision(score: ModelScore) -> tuple[str, str]:
    """mteb's (name, revision) of one of our models: the name is clipcache's model name; the revision is the
    pretrained tag, else the weights' content hash (12 hex digits), plus the precision when not fp32."""
    model, pretrained, checkpoint, precision = score.model
    if pretrained:
        revision = pretrained
    elif checkpoint and checkpoint.startswith("sha256:"):
        revision = checkpoint.split(":", 1)[1][:12]
    else:
        revision = "no_revision_available"  # mteb's own word for it
    if precision not in (None, "fp32"):
        revision += f"-{precision}"
    return model, _safe(revision)


def _source(entry: SuiteEntry, task: MiebTask) -> tuple[str, str] | None:
    """The clipcache (task, main metric) whose value is the MIEB task's main score for this dataset."""
    if entry.dataset.startswith(MIEB_PREFIX):
        return RUNNER
    return None if task.task is None or task.metric is None else (task.task, task.metric)


@dataclass(frozen=True)
class Found:
    """A result that is a MIEB task's main score: its value, experiment, and the split and language it was
    evaluated on (the result's own columns)."""

    value: float
    experiment_id: str
    split: str
    language: str


def _value(con: DuckDBPyConnection, score: ModelScore, entry: SuiteEntry, source: tuple[str, str]) -> Found | None:
    """The mapped task's metric of this model on the entry's dataset (newest reference run), with its experiment
    and the split and language the result records."""
    values, experiments, evaluated = [], set(), set()
    for metric, k in metric_parts(source[1]):
        row = con.execute(
            "SELECT value, experiment_id, split, language FROM leaderboard WHERE model = ? AND pretrained IS NOT "
            "DISTINCT FROM ? AND "
            "checkpoint IS NOT DISTINCT FROM ? AND precision IS NOT DISTINCT FROM ? AND dataset = ? AND split = ? "
            "AND language = ? AND task = ? AND metric = ? AND k IS NOT DISTINCT FROM ? AND value IS NOT NULL",
            [*score.model, entry.dataset, entry.split, entry.language, source[0], metric, k]).fetchone()
        if row is None:
            return None
        values.append(float(row[0]))
        experiments.add(row[1])
        evaluated.add((str(row[2]), str(row[3])))
    if len(experiments) != 1 or len(evaluated) != 1:
        return None
    [(split, language)] = evaluated
    return Found(float(np.mean(values)), experiments.pop(), split, language)


def _subset(task: MiebTask, language: str) -> str | None:
    if "default" in task.subsets:
        return "default"
    return language if language in task.subsets else None  # a multilingual task's results, one per language


def _model_meta(name: str, revision: str) -> dict[str, Any]:
    """model_meta.json with the fields mteb's ModelMeta.to_dict writes; what clipcache does not know is null."""
    return {"loader_kwargs": {}, "name": name, "revision": revision, "release_date": None, "languages": None,
            "n_parameters": None, "n_active_parameters_override": None, "n_embedding_parameters": None,
            "memory_usage_mb": None, "max_tokens": None, "embed_dim": None, "license": None, "open_weights": None,
            "public_training_code": None, "public_training_data": None, "framework": ["PyTorch"],
            "reference": None, "similarity_fn_name": "cosine", "use_instructions": False, "training_datasets": None,
            "adapted_from": None, "superseded_by": None, "modalities": ["image", "text"], "model_type": ["dense"],
            "citation": None, "contacts": None, "experiment_kwargs": None, "output_dtypes": None,
            "extra_requirements_groups": None, "loader": None, "is_cross_encoder": False}


def mteb_task_results(con: DuckDBPyConnection, suite: Suite, score: ModelScore) -> dict[str, dict[str, Any]]:
    """TaskName -> the TaskResult JSON (as mteb's ``to_disk`` writes it) of one model, for the suite's datasets
    with a MIEB counterpart and a result of the mapped task."""
    found: dict[str, dict[str, Any]] = {}
    for entry in suite.datasets:
        task = mieb_counterpart(entry.dataset, entry.split)
        source = None if task is None else _source(entry, task)
        if task is None or source is None:
            continue
        got = _value(con, score, entry, source)
        subset = None if got is None else _subset(task, got.language)
        if subset is None or got is None:
            continue
        # mteb's split: the result's own for a mieb:<TaskName> run; for a clip_benchmark dataset, the MIEB split
        # its (dataset, split) stands for (mieb_counterpart matched that pair)
        split = got.split if entry.dataset.startswith(MIEB_PREFIX) else task.split
        result = found.setdefault(task.name, {
            "dataset_revision": task.revision, "task_name": task.name, "mteb_version": mteb_version(),
            "scores": {}, "evaluation_time": None, "kg_co2_emissions": None, "date": None,
            "evaluation_phases": None})
        result["scores"].setdefault(split, []).append({
            task.main_score: round(got.value, 6), "main_score": round(got.value, 6), "hf_subset": subset,
            "languages": task.subsets[subset], "clipcache_experiment_id": got.experiment_id})
    return found


def write_mteb_results(con: DuckDBPyConnection, suite: Suite, scores: list[ModelScore], out: Path,
                       check: Callable[[Path], Any] | None = None) -> list[Path]:
    """Write ``<out>/results/<model>/<revision>/<TaskName>.json`` and ``model_meta.json`` for every model with a
    result on a dataset of the suite that has a MIEB counterpart; returns the task files written. ``check`` is
    called on each folder before anything is written into it (a ``results`` link under ``out`` that points into
    the cache is refused there)."""
    from clipcache.storage.atomic import atomic_write_text

    written = []
    for score in scores:
        results = mteb_task_results(con, suite, score)
        if not results:
            continue
        name, revision = model_name_and_revision(score)
        folder = out / "results" / _safe(name.replace("/", "__").replace(" ", "_")) / revision
        if check is not None:
            check(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "model_meta.json", json.dumps(_model_meta(name, revision), indent=4))
        for task_name, result in sorted(results.items()):
            path = folder / f"{task_name}.json"
            atomic_write_text(path, json.dumps(result, indent=2))
            written.append(path)
    return written
