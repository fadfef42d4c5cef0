"""The one validated run configuration. The CLI, evalscope task configs and the Prefect flow all end up here."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from clipcache.storage.errors import ConfigError
from clipcache.tasks.models.spec import ModelSpec

TaskChoice = Literal["auto", "zeroshot_classification", "zeroshot_retrieval", "text_retrieval"]


class EvaluateParams(BaseModel):
    """Parameters of the ``evaluate`` flow (also the deployment's parameter schema)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    models: list[ModelSpec] = Field(min_length=1)
    datasets: list[str] = Field(min_length=1, description="shapes, shapes_retrieval, custom, wds/<name> or a "
                                                          "catalog name")
    dataset_root: str | None = Field(None, description="dataset folder, or a template with {dataset} / "
                                                       "{dataset_cleaned}; for custom: the folder with "
                                                       "image_queries.jsonl")
    hub: Literal["huggingface", "modelscope"] = Field(
        "huggingface", description="where hosted datasets named without dataset_root are downloaded from")
    offline: bool = Field(False, description="use only datasets already downloaded into cache_dir")
    split: str = "test"
    task: TaskChoice = "auto"
    language: str = "en"
    classnames: str | None = Field(None, description="class names file (JSON list or one per line) replacing the "
                                                     "dataset's, same order and count")
    templates: str | None = Field(None, description="templates file (JSON list or one per line, with {c}) replacing "
                                                    "the dataset's")
    recall_k: list[PositiveInt] = Field(default_factory=lambda: [1, 5, 10], min_length=1)
    retrieval_metrics: list[Literal["recall", "mrr", "ndcg", "rank"]] = Field(
        default_factory=lambda: ["recall"], min_length=1,
        description="retrieval metric families: recall@k (clip_benchmark's), mrr@k, ndcg@k, rank (mean/median)")
    batch_size: PositiveInt = 64
    num_workers: int = Field(2, ge=0)
    limit: PositiveInt | None = Field(None, description="evaluate exactly the first N samples")
    amp: bool = Field(False, description="mixed precision: bf16 on CPU, fp16 on CUDA (default fp32, for parity)")
    device: str = "auto"
    on_bad_image: Literal["error", "skip"] = "error"
    output: str | None = Field(None, description="also write clip_benchmark-style JSON to this path template")
    output_dir: str = Field("outputs", description="results folder or fsspec URL (s3://bucket/prefix, gs://..., "
                                                   "memory://...)")
    cache_dir: str = Field("cache", description="embedding cache folder or fsspec URL; datasets downloaded from a "
                                                "hub go to a local folder ($CLIPCACHE_LOCAL_DIR or "
                                                "~/.cache/clipcache) when this is a URL")
    task_runner: str = Field("none", description="where encoding runs: none (in the flow), threads, dask (a local "
                                                 "Dask cluster) or dask://HOST:PORT (an existing scheduler)")
    workers: PositiveInt | None = Field(None, description="threads or local Dask workers (default: one per GPU, "
                                                          "else one per CPU core)")
    shard_rows: PositiveInt | None = Field(None, description="rows per encode shard (default: about two shards per "
                                                             "worker, at most 65,536 rows)")
    model_cache_dir: str | None = Field(None, description="where hub downloads go (default: the hubs' own caches)")
    skip_existing: bool = False
    verbose: bool = True

    @field_validator("task_runner")
    @classmethod
    def _known_runner(cls, value: str) -> str:
        if value in ("none", "threads", "dask") or re.fullmatch(r"(dask|tcp|tls)://[^\s/:]+:\d+", value):
            return value
        raise ValueError(f"expected none, threads, dask or dask://HOST:PORT, got {value!r}")

    @field_validator("datasets")
    @classmethod
    def _no_blank_names(cls, value: list[str]) -> list[str]:
        if any(not name.strip() for name in value):
            raise ValueError("dataset names must not be empty")
        return value


def local_folder(value: str) -> str:
    """For the flows that write through local-only tools (dbt, BEIR files): reject fsspec URLs by name."""
    from clipcache.storage.paths import is_url

    if is_url(value):
        raise ValueError(f"must be a local folder ({value!r} is a URL; URLs work for eval, rescore and query)")
    return value


def describe_validation_error(error: ValidationError, prefix: str = "") -> str:
    """'field.path: message' for every problem, one per line (pydantic's own text names the model, not the field)."""
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "(config)"
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = "unknown key"
        elif problem["type"] == "literal_error":
            message = f"{problem['msg']}, got {problem['input']!r}"
        lines.append(f"{prefix}{where}: {message}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def validate(model: type[BaseModel], data: Any, prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, prefix)) from e
