"""evalscope's RAGEval ``tool: mteb`` configs -> clipcache text retrieval (task ``text_retrieval``).

What runs: ``custom_tasks`` (evalscope >= 1.9, MTEB 2.x: ``{name, data_path, eval_splits}``) and the older
``tasks: [CustomRetrieval]`` + ``dataset_path`` form, each a local folder with ``corpus.jsonl``, ``queries.jsonl`` and
``qrels.jsonl`` (or BEIR's ``qrels/<split>.tsv``), evaluated with sentence-transformers models (``models``, or the
older ``model``). Each (custom task, split) is one evaluate run; the dataset is named after the task.

API embedding models are entries with ``api_base`` (and ``model_name``), as evalscope writes them: they run as
clipcache's ``api:<model_name>`` models (docs/api_models.md). An ``api_key`` in the config is put in this process's
environment (inherited by the processes it starts) under a variable of clipcache's own naming and read from there
like ``--api_key_env``; it is never written to a file, a flow parameter, a log or a validation error.

The keys are evalscope's (evalscope/backend/rag_eval/mteb/arguments.py). Keys clipcache cannot honour are errors that
say why (hosted MTEB tasks, rerankers, an API model's ``dimensions``, prompts, pooling overrides); unknown keys are errors naming the key.
Deliberate differences (docs/evalscope.md): ``limits`` evaluates the first N queries that have a relevant document
against the whole corpus (evalscope 1.9 does not apply it to custom tasks); ``max_seq_length`` is accepted but the
model's own limit is used; results are clipcache's JSON + Parquet, not MTEB's result files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, SecretStr, field_validator, model_validator

from clipcache.flows.config.evalscope_common import WorkDir, tool_name
from clipcache.flows.config.params import EvaluateParams, validate

MTEB_K_VALUES = [1, 3, 5, 10, 20, 100, 1000]  # the k MTEB's retrieval tasks report (AbsTaskRetrieval.k_values)
CUSTOM_TASK = "CustomRetrieval"  # evalscope's default custom task name
ENCODE_KEYS = {"batch_size", "show_progress_bar"}  # show_progress_bar: clipcache's own progress (verbosity)
KEY_VARIABLE = "CLIPCACHE_EVALSCOPE_API_KEY_{}"
_key_variables: dict[str, str] = {}  # an api_key given in a config -> the environment variable that holds it


def key_variable(key: str) -> str:
    """The name of this process's environment variable that holds ``key`` (set here, once per distinct key)."""
    if key not in _key_variables:
        name = KEY_VARIABLE.format(len(_key_variables) + 1)
        os.environ[name] = key
        _key_variables[key] = name
    return _key_variables[key]


def _unsupported(value: Any, empty: Any, key: str, why: str) -> None:
    if value not in (None, empty):
        raise ValueError(f"{key}: {why}")


def _encode_kwargs(value: dict[str, Any] | None) -> dict[str, Any] | None:
    extra = sorted(set(value or {}) - ENCODE_KEYS)
    if extra:
        raise ValueError(f"{extra[0]}: not supported in encode_kwargs (clipcache takes {', '.join(sorted(ENCODE_KEYS))}"
                         f"; vectors are always L2-normalised, compared by cosine as MTEB does)")
    return value


class MtebModel(BaseModel):
    # an api_key is a field: no validation error may show the input it was given
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), hide_input_in_errors=True)

    model_name_or_path: str = ""
    model_name: str | None = None  # evalscope: an alias of model_name_or_path (API models use it with api_base)
    hub: Literal["modelscope", "huggingface", "local"] = "modelscope"
    max_seq_length: PositiveInt = 512  # accepted; the model's own max_seq_length is used (docs/evalscope.md)
    encode_kwargs: dict[str, Any] = Field(default_factory=lambda: {"batch_size": 32})
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    is_cross_encoder: bool = False
    pooling_mode: str | None = None
    prompt: str | None = None
    prompts: dict[str, str] | None = None
    api_base: str | None = None  # an API embedding model (model_name at api_base): clipcache's api: models
    api_key: SecretStr | None = None  # kept in this process's environment only (key_variable)
    dimensions: int | None = None

    _encode = field_validator("encode_kwargs")(classmethod(lambda cls, value: _encode_kwargs(value)))

    @model_validator(mode="after")
    def _supported(self) -> MtebModel:
        if not (self.model_name_or_path or self.model_name):
            raise ValueError("model_name_or_path: required (a sentence-transformers model id or folder)")
        _unsupported(self.is_cross_encoder, False, "is_cross_encoder",
                     "rerankers (two-stage retrieval) are not supported; give embedding models only")
        if self.api_key is not None and self.api_base is None:
            raise ValueError("api_key: only API embedding models take it (give api_base too)")
        _unsupported(self.dimensions, None, "dimensions", "not supported: an API model's vectors are used at the "
                                                          "size the server returns")
        _unsupported(self.pooling_mode, None, "pooling_mode", "not supported: the model folder's own pooling "
                                                              "(modules.json) is used")
        _unsupported(self.prompt, "", "prompt", "query prompts are not supported")
        _unsupported(self.prompts, {}, "prompts", "query prompts are not supported")
        dtype = self.model_kwargs.get("torch_dtype", "auto")
        if set(self.model_kwargs) - {"torch_dtype"} or str(dtype) not in ("auto", "float32", "torch.float32"):
            raise ValueError("model_kwargs: only torch_dtype auto / float32 is supported (use amp: true for "
                             "mixed precision)")
        return self

    def spec(self) -> dict[str, Any]:
        if self.api_base is not None:
            name = self.model_name or self.model_name_or_path
            key = {} if self.api_key is None else {"api_key_env": key_variable(self.api_key.get_secret_value())}
            return {"model_name": name if name.startswith("api:") else f"api:{name}", "api_base": self.api_base,
                    **key}
        return {"model_name": self.model_name_or_path or self.model_name, "model_type": "sentence_transformers",
                "hub": self.hub}


class MtebCustomTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default=CUSTOM_TASK, min_length=1)
    data_path: str = Field(min_length=1)
    eval_splits: list[str] = Field(default_factory=lambda: ["test"], min_length=1)


class MtebEval(BaseModel):
    model_config = ConfigDict(extra="forbid")

    custom_tasks: list[MtebCustomTask] | None = None
    tasks: list[str] | None = None  # evalscope < 1.9: ["CustomRetrieval"] with dataset_path
    dataset_path: str | None = None
    task_names: list[str] | None = None
    task_types: list[str] | None = None
    languages: list[str] | None = None
    splits: dict[str, Any] | None = None
    output_folder: str = "outputs"
    overwrite_results: bool = True
    limits: PositiveInt | None = None
    hub: Literal["modelscope", "huggingface"] = "modelscope"  # where MTEB's hosted datasets come from: unused here
    top_k: PositiveInt = 10  # evalscope uses it only for the reranking stage, which clipcache does not run
    verbosity: int = Field(2, ge=0, le=3)
    encode_kwargs: dict[str, Any] | None = None
    # clipcache extensions (same meaning as the CLI flags)
    cache_dir: str = "cache"
    device: str = "auto"
    amp: bool = False
    model_cache_dir: str | None = None

    _encode = field_validator("encode_kwargs")(classmethod(lambda cls, value: _encode_kwargs(value)))

    @model_validator(mode="after")
    def _local_tasks_only(self) -> MtebEval:
        why = ("MTEB's hosted tasks are downloaded from a hub, which clipcache does not run; evaluate local folders "
               "with custom_tasks: [{name, data_path}]")
        for key in ("task_names", "task_types", "languages"):
            _unsupported(getattr(self, key), [], key, why)
        _unsupported(self.splits, {}, "splits", "give the splits in each custom task's eval_splits")
        if self.tasks is not None and (self.tasks != [CUSTOM_TASK] or self.dataset_path is None):
            raise ValueError(f"tasks: only [{CUSTOM_TASK}] with dataset_path (a local folder) runs; {why}")
        if self.dataset_path is not None and self.tasks is None:
            raise ValueError(f"dataset_path: give it with tasks: [{CUSTOM_TASK}]")
        if not self.custom_tasks and self.tasks is None:
            raise ValueError("custom_tasks: required (a list of {name, data_path, eval_splits})")
        names = [t.name for t in self.all_tasks()]
        if len(set(names)) != len(names):
            raise ValueError(f"custom_tasks: task names must differ (they name the results), got {names}")
        return self

    def all_tasks(self) -> list[MtebCustomTask]:
        old = [MtebCustomTask(data_path=self.dataset_path)] if self.tasks is not None and self.dataset_path else []
        return [*(self.custom_tasks or []), *old]


class MtebToolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: Literal["mteb"]
    models: list[MtebModel] | None = None
    model: list[MtebModel] | None = None  # evalscope < 1.9
    eval: MtebEval

    _tool = field_validator("tool", mode="before")(classmethod(lambda cls, value: tool_name(value)))

    @model_validator(mode="after")
    def _one_model_list(self) -> MtebToolConfig:
        if (self.models is None) == (self.model is None):
            raise ValueError("models: give the model list once (models, or model as evalscope < 1.9 called it)")
        if not self.model_list():
            raise ValueError("models: at least one model")
        return self

    def model_list(self) -> list[MtebModel]:
        return self.models if self.models is not None else self.model or []


class MtebTaskConfig(WorkDir):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # the models' api_key (see MtebModel)
    eval_config: MtebToolConfig


def mteb_runs(data: dict[str, Any]) -> Iterator[EvaluateParams]:
    """One validated EvaluateParams per (custom task, split); all are built before any runs."""
    cfg: MtebTaskConfig = validate(MtebTaskConfig, data)
    ev, models = cfg.eval_config.eval, cfg.eval_config.model_list()
    batch = (ev.encode_kwargs or {}).get("batch_size") or min(m.encode_kwargs.get("batch_size", 32) for m in models)
    output_dir = cfg.output_dir(ev.output_folder, "output_folder" in ev.model_fields_set, "output_folder")
    runs = []
    for task in ev.all_tasks():
        for split in task.eval_splits:
            runs.append(validate(EvaluateParams, {
                "models": [m.spec() for m in models], "datasets": [task.name], "dataset_root": task.data_path,
                "split": split, "task": "text_retrieval", "recall_k": MTEB_K_VALUES, "limit": ev.limits,
                "batch_size": batch, "output_dir": output_dir, "cache_dir": ev.cache_dir, "device": ev.device,
                "amp": ev.amp, "model_cache_dir": ev.model_cache_dir, "skip_existing": not ev.overwrite_results,
                "verbose": ev.verbosity > 0}))
    yield from runs
