"""evalscope's task configuration (``eval_backend: RAGEval``) -> the flows' parameters.

- ``eval_config.tool: clip_benchmark``: EvaluateParams (or, for ``task: image_caption``, ConvertParams), with the
  same keys and defaults as evalscope's CLIP benchmark backend. Model ids default to ModelScope, as in evalscope.
- ``eval_config.tool: mteb``: text retrieval of ``custom_tasks`` folders (flows/config/evalscope_mteb.py).
- top level ``work_dir`` / ``no_timestamp``: as in evalscope, results go to ``<work_dir>/<YYYYmmdd_HHMMSS>/``
  (``<work_dir>/`` with ``no_timestamp``) instead of the eval section's output folder.

Besides evalscope's keys, the clip_benchmark tool's ``eval`` section takes every registered task's options (built-in
and from installed plugins: the run parameters flows/config/task_params.py derives from the task registry, with the
same names, types, defaults and checks as the ``clipcache eval`` flags). Unknown keys are an error naming the key
(evalscope silently ignores them).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, create_model, field_validator

from clipcache.flows.config.convert_params import CaptionModelSpec, ConvertParams
from clipcache.flows.config.evalscope_common import WorkDir, tool_name
from clipcache.flows.config.params import (
    OPTION_TASKS,
    SWEPT_OPTIONS,
    EvaluateParams,
    RetrievalMetric,
    TaskOptionParams,
    known_task,
    validate,
)
from clipcache.flows.config.task_params import extended_model
from clipcache.storage.errors import ConfigError, parse_problem
from clipcache.tasks.models.api_spec import ApiFields


class EvalscopeModel(ApiFields):  # ApiFields: api_base, api_revision, ... of api: models (docs/api_models.md)
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_name: str
    pretrained: str | None = None
    model_type: str = "auto"
    arch_config: str | None = None
    revision: str | None = None
    hub: Literal["huggingface", "modelscope", "local"] = "modelscope"  # local: evalscope's HubType.LOCAL
    trust_remote_code: bool = False  # this entry's own folder code may run (--model_type internvl); never another's


class _EvalscopeCommon(BaseModel):
    """The ``eval`` keys evalscope's clip_benchmark tool shares between its tasks, with evalscope's defaults."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    dataset_name: list[str] = Field(min_length=1)
    data_dir: str | None = None
    split: str = "test"
    batch_size: PositiveInt = 128
    num_workers: int = Field(1, ge=0)
    verbose: bool = True
    skip_existing: bool = False
    output_dir: str = "outputs"
    cache_dir: str = "cache"
    limit: PositiveInt | None = None
    # clipcache extensions (same meaning as the CLI flags)
    hub: Literal["huggingface", "modelscope"] = "modelscope"  # evalscope downloads from ModelScope
    offline: bool = False


# pydantic orders fields base by base from the last: evalscope's keys, then the task options (as EvaluateParams')
class EvalscopeEval(TaskOptionParams, _EvalscopeCommon):
    """evalscope's clip_benchmark ``eval`` section with clipcache's keys, and every built-in task's options; a run
    with tasks registered besides clipcache's own validates with ``for_registry()``, which adds theirs."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    option_tasks: ClassVar[tuple[type, ...]] = OPTION_TASKS
    swept_options: ClassVar[tuple[str, ...]] = SWEPT_OPTIONS

    models: list[EvalscopeModel] = Field(min_length=1)
    task: str = "auto"
    language: str | list[str] = "en"

    _task = field_validator("task")(known_task)
    classnames: str | None = None
    templates: str | None = None
    recall_k: list[PositiveInt] = Field(default_factory=lambda: [1, 5, 10], min_length=1)
    retrieval_metrics: list[RetrievalMetric] = Field(default_factory=lambda: list[RetrievalMetric](["recall"]),
                                                     min_length=1)
    amp: bool = False
    device: str = "auto"
    on_bad_image: Literal["error", "skip"] = "error"
    output: str | None = None
    model_cache_dir: str | None = None
    task_runner: str = "none"
    workers: PositiveInt | None = None
    shard_rows: PositiveInt | None = None


class EvalscopeCaptionEval(_EvalscopeCommon):
    """evalscope's ``task: image_caption`` (convert an image-text dataset to BEIR with a multimodal LLM).
    ``batch_size`` and ``num_workers`` are accepted for compatibility; concurrency is set per model."""

    models: list[CaptionModelSpec] = Field(min_length=1)
    task: Literal["image_caption"]


class EvalscopeEvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: Literal["clip_benchmark"]
    eval: EvalscopeEval

    _tool = field_validator("tool", mode="before")(classmethod(lambda cls, value: tool_name(value)))


class _CaptionEvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: Literal["clip_benchmark"]
    eval: EvalscopeCaptionEval

    _tool = field_validator("tool", mode="before")(classmethod(lambda cls, value: tool_name(value)))


class EvalscopeTaskConfig(WorkDir):
    eval_config: EvalscopeEvalConfig

    @classmethod
    def for_registry(cls) -> type[EvalscopeTaskConfig]:
        """This model, its ``eval`` section taking the options of every task registered besides clipcache's own."""
        return _config_model(extended_model(EvalscopeEval))


@cache
def _config_model(section: type[EvalscopeEval]) -> type[EvalscopeTaskConfig]:
    if section is EvalscopeEval:
        return EvalscopeTaskConfig
    eval_config: Any = create_model("EvalscopeEvalConfig", __base__=EvalscopeEvalConfig, __module__=__name__,
                                    eval=(section, ...))
    return create_model("EvalscopeTaskConfig", __base__=EvalscopeTaskConfig, __module__=__name__,
                        eval_config=(eval_config, ...))


def load_task_config(source: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A task config given as a dict, or a path to a JSON / YAML file."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"task config file {path} not found")
    try:
        text = path.read_text(encoding="utf-8-sig")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except UnicodeDecodeError as e:
        raise ConfigError(f"task config {path} is not UTF-8 text (byte {e.start + 1}); save it as UTF-8") from e
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"task config {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{parse_problem(e)}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"task config {path} must hold a mapping at the top level")
    return data


class EvalscopeCaptionConfig(WorkDir):
    eval_config: _CaptionEvalConfig


def parse_task_config(task_cfg: dict[str, Any] | str | Path) -> list[EvaluateParams | ConvertParams]:
    """An evalscope task config -> the runs it asks for: the evaluate flow's parameters, the convert flow's
    (clip_benchmark ``task: image_caption``), or one evaluate run per MTEB custom task and split."""
    data = load_task_config(task_cfg)
    eval_config = data.get("eval_config")
    section = eval_config.get("eval") if isinstance(eval_config, dict) else None
    if isinstance(eval_config, dict) and tool_name(eval_config.get("tool")) == "mteb":
        from clipcache.flows.config.evalscope_mteb import mteb_runs

        return list(mteb_runs(data))
    if isinstance(section, dict) and section.get("task") == "image_caption":
        cfg = validate(EvalscopeCaptionConfig, data)
        ev = cfg.eval_config.eval
        return [validate(ConvertParams, {
            **ev.model_dump(exclude={"models", "dataset_name", "data_dir", "task", "batch_size", "num_workers"}),
            "models": ev.models, "datasets": ev.dataset_name, "dataset_root": ev.data_dir,
            "output_dir": cfg.output_dir(ev.output_dir, "output_dir" in ev.model_fields_set, "output_dir")})]
    return [to_evaluate_params(data)]


def to_evaluate_params(task_cfg: dict[str, Any] | str | Path) -> EvaluateParams:
    data = load_task_config(task_cfg)
    cfg: EvalscopeTaskConfig = validate(EvalscopeTaskConfig.for_registry(), data)
    ev = cfg.eval_config.eval
    fields = ev.model_dump(exclude={"models", "dataset_name", "data_dir"})
    return validate(EvaluateParams.for_registry(), {
        **fields,
        "models": [m.model_dump() for m in ev.models],
        "datasets": ev.dataset_name,
        "dataset_root": ev.data_dir,
        "output_dir": cfg.output_dir(ev.output_dir, "output_dir" in ev.model_fields_set, "output_dir"),
    })
