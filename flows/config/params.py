"""The one validated run configuration. The CLI (its flags are generated from this model), evalscope task configs and
the Prefect flows all end up here, and it hands each stage its own typed settings.

Names (tasks, datasets, model loaders) are checked here, against registries and the catalog, without importing torch,
open_clip or Prefect: a typo fails with its suggestion before any work starts.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from clipcache.flows.config.run_settings import Evaluation, OptionValues, OutputSettings, RunSettings
from clipcache.flows.config.task_params import builtin_tasks, extended_model, options_model, swept_names
from clipcache.storage.errors import ClipcacheError, ConfigError
from clipcache.tasks.contract import (
    BATCH_SIZE,
    DataSource,
    DecodeMode,
    DecodePoolKind,
    EncodeSettings,
    OnBadImage,
    PromptSettings,
    ScoreSettings,
)
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    from clipcache.tasks.evaluation.base import EvalTask

RetrievalMetric = Literal["recall", "mrr", "ndcg", "rank"]


def known_task(value: str) -> str:
    from clipcache.tasks.evaluation import TASKS

    if value != "auto" and value not in TASKS:
        raise ValueError(f"unknown task {value!r} (known: auto, {', '.join(TASKS.names())}){TASKS.suggest(value)}")
    return value


class RunInputs(BaseModel):
    """What a run evaluates and which metrics it reports (the first of ``EvaluateParams``' fields)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    models: list[ModelSpec] = Field(min_length=1, description="models to evaluate (the CLI's --model x --pretrained "
                                                              "product, or --pretrained_model pairs)")
    datasets: list[str] = Field(min_length=1, description="shapes, shapes_retrieval, custom, imagefolder, "
                                                          "image_labels, wds/<name>, a catalog name, a clip_benchmark "
                                                          "collection (vtab, vtab+, retrieval, imagenet_robustness, "
                                                          "sugar_crepe) or a file of names")
    suite: str | None = Field(None, description="a suite (clipcache suite list, or a suite .yaml file): its datasets "
                                                "are evaluated, each with its own task and the suite's split and "
                                                "language, besides any --dataset")
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
    recall_k: list[PositiveInt] = Field(default_factory=lambda: list(ScoreSettings.recall_k), min_length=1,
                                        description="k values")
    retrieval_metrics: list[RetrievalMetric] = Field(
        default_factory=lambda: list[RetrievalMetric](["recall"]), min_length=1,
        description="retrieval metric families: recall@k (clip_benchmark's), mrr@k, ndcg@k, rank (mean/median)")
    bootstrap: int = Field(ScoreSettings.bootstrap, ge=0, description="bootstrap resamples of each metric's 95% "
                                                                       "interval (0: no intervals)")

# clipcache's own tasks whose options are run parameters, and the parameters they make (flows/config/task_params.py)
OPTION_TASKS: tuple[type[EvalTask], ...] = tuple(t for t in builtin_tasks() if t.Options.model_fields)
SWEPT_OPTIONS = swept_names(OPTION_TASKS)  # a list of values: one experiment per value


class RunExecution(BaseModel):
    """How a run executes and where its results go (the last of ``EvaluateParams``' fields)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    normalize: str = Field("true", description="linear_probe: L2-normalised features, clip_benchmark's default "
                                               "(the only choice: the cache holds normalised embeddings)")
    batch_size: PositiveInt = Field(BATCH_SIZE, description="images or texts per forward pass")
    num_workers: int | None = Field(EncodeSettings.num_workers, ge=0, description="image decoding workers "
                                    "(default: one per CPU core available; 0: decode in the encoding thread)")
    decode: DecodeMode = Field("cpu", description="where images are decoded and resized: cpu (PIL, as "
                                                  "clip_benchmark), or gpu (nvJPEG on the CUDA device; other "
                                                  "numbers, cached apart)")
    decode_pool: DecodePoolKind = Field(EncodeSettings.decode_pool, description="what decodes on the CPU: "
                                        "processes, threads, or auto (processes from 4,096 images); same numbers")
    prefetch: PositiveInt = Field(EncodeSettings.prefetch, description="batches each decoding worker decodes ahead "
                                  "(torch DataLoader's prefetch_factor); same numbers")
    limit: PositiveInt | None = Field(None, description="evaluate exactly the first N samples")
    amp: bool = Field(False, description="mixed precision: bf16 on CPU, fp16 on CUDA (default fp32, for parity)")
    device: str = Field("auto", description="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    on_bad_image: OnBadImage = Field(EncodeSettings.on_bad_image, description="an image that does not decode")
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


TaskOptionParams: Any = options_model(list(OPTION_TASKS), taken={*RunInputs.model_fields, *RunExecution.model_fields})


# pydantic orders fields base by base from the last: RunInputs', the task options', RunExecution's (the flags' order)
class EvaluateParams(RunExecution, TaskOptionParams, RunInputs):
    """Parameters of the ``evaluate`` / ``rescore`` flows (also the deployments' parameter schema): what is
    evaluated, every built-in task's options (derived from the task registry), how the run executes. A run with
    tasks registered besides clipcache's own validates with ``for_registry()``, which adds their options."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    option_tasks: ClassVar[tuple[type[EvalTask], ...]] = OPTION_TASKS
    swept_options: ClassVar[tuple[str, ...]] = SWEPT_OPTIONS

    @model_validator(mode="before")
    @classmethod
    def _suite_datasets(cls, data: Any) -> Any:
        """--suite adds the suite's datasets, each evaluated with its own split and language (suite_runs.py)."""
        if isinstance(data, dict) and data.get("suite"):
            from clipcache.flows.config.suite_runs import with_suite_datasets

            return with_suite_datasets(data)
        return data

    @model_serializer(mode="wrap")
    def _suite_split_as_given(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A suite run given no --split / --language has no one split or language (each dataset takes the suite's):
        its dump leaves them out, so that a run retried from the parameters Prefect stored validates as it did."""
        data = dump(self)
        for name in ("split", "language") if self.suite else ():
            if name not in self.model_fields_set:
                data.pop(name, None)
        return data

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
        from clipcache.tasks.datasets.clip_benchmark.collections import expand_datasets

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
        from clipcache.tasks.datasets.clip_benchmark.layouts import languages_of

        languages: dict[str, list[str]] = {}
        for evaluation in self.evaluations():
            languages.setdefault(evaluation.dataset, []).append(evaluation.language)
        for i, name in enumerate(self.datasets):
            try:
                check_name(name, self.dataset_root)
            except ClipcacheError as e:
                raise ValueError(f"datasets.{i}: {e}") from None
            known = languages_of(name)
            missing = [lang for lang in languages[name] if known is not None and lang not in known]
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

    @model_validator(mode="after")
    def _annotation_file_used(self) -> EvaluateParams:
        """clip_benchmark's --annotation_file replaces a caption set's caption file; any other dataset would
        silently ignore it."""
        if self.annotation_file is None:
            return self
        from clipcache.tasks.datasets.clip_benchmark.layouts import annotation_datasets

        takers = annotation_datasets()
        for name in self.datasets:
            if name not in takers:
                raise ValueError(f"annotation_file: dataset {name!r} does not read an annotation file (it replaces "
                                 f"the caption file of {', '.join(takers)})")
        return self

    @model_validator(mode="after")
    def _output_outside_the_stores(self) -> EvaluateParams:
        """Results never land in a cache: output_dir, and clip_benchmark's --output pattern (tasks/results.py)."""
        from clipcache.storage.paths import check_results_folder

        try:
            check_results_folder(self.output_dir, self.cache_dir)
            if self.output is not None:
                from clipcache.tasks.results import check_output_location

                check_output_location(self.output, self.output_dir, self.cache_dir)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self

    @model_validator(mode="after")
    def _valid_task_options(self) -> EvaluateParams:
        """Each task's options, as its Options model checks them (every swept value too)."""
        for task in self.option_tasks:
            try:
                self.option_values().for_task(task.Options)
            except ConfigError as e:
                raise ValueError(str(e)) from None
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
    def evaluations(self) -> list[Evaluation]:
        """Every (dataset, split, language) of the run, in order: a suite's datasets with the suite's own split and
        language, any other with --split and each --language (flows/config/suite_runs.py)."""
        from clipcache.flows.config.suite_runs import evaluations

        return evaluations(self.suite, self.datasets, self.split, self.language)

    def option_values(self) -> OptionValues:
        """The values of every parameter that is some task's option (a task takes those its Options declare)."""
        names = {name for task in self.option_tasks for name in task.Options.model_fields}
        values = {name: getattr(self, name) for name in names if name not in self.swept_options}
        return OptionValues(values, {name: tuple(getattr(self, name)) for name in self.swept_options})

    @classmethod
    def for_registry(cls) -> type[EvaluateParams]:
        """This model, with the options of every task registered besides clipcache's own (installed plugins,
        ``TASKS.register`` in the process) as further parameters (flows/config/task_params.py)."""
        return extended_model(cls)

    def run_settings(self, cached_only: bool) -> RunSettings:
        """The typed settings of every pair of the run; the pipeline reads these, not this model."""
        from clipcache.storage.paths import local_dir

        source = DataSource("", self.dataset_root, split=self.split, limit=self.limit, hub=self.hub,
                            data_dir=str(local_dir(self.cache_dir)), offline=self.offline,
                            annotation_file=self.annotation_file)
        return RunSettings(
            task=self.task, source=source, evaluations=tuple(self.evaluations()),
            prompts=PromptSettings(classnames=self.classnames, templates=self.templates),
            encode=EncodeSettings(self.batch_size, self.num_workers, self.on_bad_image, cached_only,
                                  decode_pool=self.decode_pool, prefetch=self.prefetch),
            score=ScoreSettings(tuple(self.recall_k), tuple(self.retrieval_metrics), batch_size=self.batch_size,
                                bootstrap=self.bootstrap),
            options=self.option_values(),
            output=OutputSettings(output_dir=self.output_dir, template=self.output, skip_existing=self.skip_existing,
                                  dump_classnames=self.dump_classnames, dump_templates=self.dump_templates),
            cache_dir=self.cache_dir, amp=self.amp, decode=self.decode)


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
