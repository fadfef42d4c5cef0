"""The one validated run configuration. The CLI (its flags are generated from this model), evalscope task configs and
the Prefect flows all end up here, and it hands each stage its own typed settings.

Names (tasks, datasets, model loaders) are checked here, against registries and the catalog, without importing torch,
open_clip or Prefect: a typo fails with its suggestion before any work starts.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from clipcache.storage.errors import ClipcacheError, ConfigError
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, PromptSettings, ScoreSettings
from clipcache.tasks.models.spec import ModelSpec

RetrievalMetric = Literal["recall", "mrr", "ndcg", "rank"]


def known_task(value: str) -> str:
    from clipcache.tasks.evaluation import TASKS

    if value != "auto" and value not in TASKS:
        raise ValueError(f"unknown task {value!r} (known: auto, {', '.join(TASKS.names())}){TASKS.suggest(value)}")
    return value


class EvaluateParams(BaseModel):
    """Parameters of the ``evaluate`` / ``rescore`` flows (also the deployments' parameter schema)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    models: list[ModelSpec] = Field(min_length=1, description="models to evaluate (the CLI's --model x --pretrained "
                                                              "product, or --pretrained_model pairs)")
    datasets: list[str] = Field(min_length=1, description="shapes, shapes_retrieval, custom, imagefolder, "
                                                          "image_labels, wds/<name>, a catalog name, a clip_benchmark "
                                                          "collection (vtab, vtab+, retrieval, imagenet_robustness, "
                                                          "sugar_crepe) or a file of names")
    dataset_root: str | None = Field(None, description="dataset folder, or a template with {dataset} / "
                                                       "{dataset_cleaned}; for custom: the folder with "
                                                       "image_queries.jsonl; for text_retrieval: a BEIR folder")
    hub: Literal["huggingface", "modelscope"] = Field(
        "huggingface", description="where hosted datasets named without dataset_root are downloaded from")
    offline: bool = Field(False, description="use only datasets already downloaded into cache_dir")
    split: str = Field("test", description="dataset split")
    annotation_file: str | None = Field(None, description="caption file replacing a caption dataset's default one "
                                                          "(mscoco_captions, flickr30k, ...; clip_benchmark's "
                                                          "--annotation_file)")
    task: str = Field("auto", description="auto (the dataset's own task), or a registered task")
    language: list[str] = Field(default_factory=lambda: ["en"], min_length=1,
                                description="languages of class names / captions; several are evaluated in turn")
    classnames: str | None = Field(None, description="class names file (JSON list or one per line) replacing the "
                                                     "dataset's, same order and count (a what-if)")
    templates: str | None = Field(None, description="templates file (JSON list or one per line, with {c}) replacing "
                                                    "the dataset's (a what-if)")
    recall_k: list[PositiveInt] = Field(default_factory=lambda: [1, 5, 10], min_length=1, description="k values")
    retrieval_metrics: list[RetrievalMetric] = Field(
        default_factory=lambda: list[RetrievalMetric](["recall"]), min_length=1,
        description="retrieval metric families: recall@k (clip_benchmark's), mrr@k, ndcg@k, rank (mean/median)")
    ties: Literal["topk", "stable"] = Field(
        "topk", description="retrieval ties: topk keeps what torch.topk keeps, as clip_benchmark (default); stable "
                            "ranks equal scores by index, independent of the order of the data")
    train_split: str = Field("train", description="linear_probe: the split the probe learns from")
    val_split: str | None = Field(None, description="linear_probe: a split to choose the weight decay on "
                                                    "(clip_benchmark's sweep); exclusive with val_proportion")
    val_proportion: float | None = Field(None, gt=0, lt=1, description="linear_probe: the share of the train split "
                                                                        "held out to choose the weight decay")
    fewshot_k: list[Annotated[int, Field(ge=-1)]] = Field(
        default_factory=lambda: [-1], min_length=1,
        description="linear_probe: training samples per class (-1: all, else >= 1); several values give one probe "
                    "(one experiment) each over the same cached features")
    fewshot_lr: float = Field(0.1, gt=0, description="linear_probe: learning rate (AdamW, cosine schedule)")
    fewshot_epochs: PositiveInt = Field(10, description="linear_probe: epochs")
    seed: int = Field(0, description="linear_probe: seed of the layer's initialisation, the batch order, the "
                                     "few-shot pick and the val_proportion split; image_clustering: k-means' seed")
    normalize: str = Field("true", description="linear_probe: L2-normalised features, clip_benchmark's default "
                                               "(the only choice: the cache holds normalised embeddings)")
    batch_size: PositiveInt = Field(64, description="images or texts per forward pass")
    num_workers: int = Field(2, ge=0, description="image decoding threads")
    limit: PositiveInt | None = Field(None, description="evaluate exactly the first N samples")
    amp: bool = Field(False, description="mixed precision: bf16 on CPU, fp16 on CUDA (default fp32, for parity)")
    device: str = Field("auto", description="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    on_bad_image: Literal["error", "skip"] = Field("error", description="an image that does not decode")
    output: str | None = Field(None, description="also write clip_benchmark-style JSON to this path template, e.g. "
                                                 "'{dataset}_{model}_{task}.json'")
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
    skip_existing: bool = Field(False, description="skip an experiment whose result file exists")
    dump_classnames: bool = Field(False, description="write the class names used into each result JSON "
                                                     "(clip_benchmark's --dump_classnames)")
    dump_templates: bool = Field(False, description="write the templates used into each result JSON "
                                                    "(clip_benchmark's --dump_templates)")
    verbose: bool = Field(True, description="progress bars")

    @field_validator("language", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("split", "train_split", "val_split")
    @classmethod
    def _plain_split(cls, value: str | None) -> str | None:
        return plain_name(value)

    @field_validator("output")
    @classmethod
    def _plain_output_fields(cls, value: str | None) -> str | None:
        """A pattern with an attribute, index or unknown field fails here, not after the whole evaluation ran."""
        if value is None:
            return value
        from clipcache.tasks.results import check_output_template

        try:
            return check_output_template(value)
        except ClipcacheError as e:
            raise ValueError(str(e).removeprefix("output: ")) from None

    @field_validator("task_runner")
    @classmethod
    def _known_runner(cls, value: str) -> str:
        if value in ("none", "threads", "dask") or re.fullmatch(r"(dask|tcp|tls)://[^\s/:]+:\d+", value):
            return value
        raise ValueError(f"expected none, threads, dask or dask://HOST:PORT, got {value!r}")

    _task = field_validator("task")(classmethod(lambda cls, value: known_task(value)))

    @field_validator("datasets")
    @classmethod
    def _no_blank_names(cls, value: list[str]) -> list[str]:
        if any(not name.strip() for name in value):
            raise ValueError("dataset names must not be empty")
        check_printable(value, "dataset name")
        from clipcache.tasks.datasets.collections import expand_datasets

        try:  # clip_benchmark's collections (vtab, vtab+, retrieval, ...) and files of names, as its --dataset
            return expand_datasets(value)
        except ClipcacheError as e:
            raise ValueError(str(e).removeprefix("datasets: ")) from None

    @model_validator(mode="after")
    def _known_datasets(self) -> EvaluateParams:
        """Any name goes for a BEIR folder (text_retrieval names its own datasets); otherwise the registry or the
        catalog must know it."""
        from clipcache.tasks.datasets import check_name

        if self.task == "text_retrieval":
            return self
        from clipcache.tasks.datasets.layouts import languages_of

        for i, name in enumerate(self.datasets):
            try:
                check_name(name, self.dataset_root)
            except ClipcacheError as e:
                raise ValueError(f"datasets.{i}: {e}") from None
            known = languages_of(name)
            missing = [lang for lang in self.language if known is not None and lang not in known]
            if missing and known is not None:  # before any work: clip_benchmark's product of datasets and languages must all exist
                shown = ", ".join(known[:12]) + (f", ... ({len(known)} in all)" if len(known) > 12 else "")
                raise ValueError(f"language: {missing[0]!r} is not available for dataset {name!r} (available: "
                                 f"{shown})")
        return self

    @field_validator("normalize", mode="before")
    @classmethod
    def _normalised_only(cls, value: Any) -> str:
        if str(value).strip().lower() in ("true", "1", "yes"):
            return "true"
        raise ValueError(f"{value!r}: only normalised features can be probed (the cache holds L2-normalised "
                         f"embeddings, clip_benchmark's default --normalize True)")

    @field_validator("fewshot_k", mode="before")
    @classmethod
    def _one_or_several_k(cls, value: Any) -> Any:
        return [value] if isinstance(value, (int, str)) else value

    @field_validator("fewshot_k")
    @classmethod
    def _all_or_some(cls, value: list[int]) -> list[int]:
        if 0 in value:
            raise ValueError("0 samples per class trains nothing: give -1 (all) or a number >= 1")
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _annotation_file_used(self) -> EvaluateParams:
        """clip_benchmark's --annotation_file replaces a caption set's caption file; any other dataset would
        silently ignore it."""
        if self.annotation_file is None:
            return self
        from clipcache.tasks.datasets.layouts import annotation_datasets

        takers = annotation_datasets()
        for name in self.datasets:
            if name not in takers:
                raise ValueError(f"annotation_file: dataset {name!r} does not read an annotation file (it replaces "
                                 f"the caption file of {', '.join(takers)})")
        return self

    @model_validator(mode="after")
    def _one_validation_source(self) -> EvaluateParams:
        if self.val_split is not None and self.val_proportion is not None:
            raise ValueError("val_split and val_proportion: give one of them (as clip_benchmark)")
        return self

    @model_validator(mode="after")
    def _known_models(self) -> EvaluateParams:
        from clipcache.tasks.models.resolve import loader_for

        for i, spec in enumerate(self.models):
            try:
                loader_for(spec)
            except ClipcacheError as e:
                raise ValueError(f"models.{i}.model_name: {e}") from None
        return self

    # -- what each stage gets --------------------------------------------------------------------------------------
    def source(self, dataset: str, data_dir: str, language: str = "en") -> DataSource:
        return DataSource(dataset, self.dataset_root, self.split, self.limit, self.hub, data_dir, self.offline,
                          language, self.annotation_file)

    def encode_settings(self, cached_only: bool) -> EncodeSettings:
        return EncodeSettings(self.batch_size, self.num_workers, self.on_bad_image, cached_only, self.train_split,
                              self.val_split)

    def score_settings(self, device: str) -> list[ScoreSettings]:
        """One ScoreSettings per variant the run asks for: several --fewshot_k values give one each (tasks that do
        not read a setting get one experiment from them all; see EvalTask.options)."""
        return [ScoreSettings(tuple(self.recall_k), tuple(self.retrieval_metrics), self.ties, device, self.batch_size,
                              train_split=self.train_split, val_split=self.val_split,
                              val_proportion=self.val_proportion, fewshot_k=k, fewshot_lr=self.fewshot_lr,
                              fewshot_epochs=self.fewshot_epochs, seed=self.seed) for k in self.fewshot_k]

    def prompt_settings(self, language: str) -> PromptSettings:
        return PromptSettings(language, self.classnames, self.templates)


def plain_name(value: str | None) -> str | None:
    """A split names folders and files (``<root>/<split>/``, ``qrels/<split>.tsv``): one plain path component."""
    from clipcache.storage.naming import path_component

    if value is not None and path_component(value) != value:
        raise ValueError(f"{value!r} is not a plain name (letters, digits, '.', '-', '_'; no path separators)")
    return value


def check_printable(names: list[str], what: str) -> None:
    """Names become file names and log lines: NUL and other control characters are refused by name."""
    for name in names:
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
            raise ValueError(f"{what} {name!r} holds a control character (NUL, newline, ...)")


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
        where = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown key"
        elif problem["type"] == "literal_error":
            message = f"{message}, got {problem['input']!r}"
        lines.append(f"{prefix}{where}: {message}" if where else f"{prefix}{message}")
    if len(lines) == 1:
        return f"invalid configuration: {lines[0]}"
    return "invalid configuration:\n  " + "\n  ".join(lines)


def validate(model: type[BaseModel], data: Any, prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, prefix)) from e
