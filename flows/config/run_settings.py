"""The typed settings one evaluation run hands its pairs, built once from the run's parameters
(``EvaluateParams.run_settings``): the pipeline and the stages below it read these, never the parameter model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product
from typing import Any, NamedTuple, TypeVar

from pydantic import ValidationError

from clipcache.storage.errors import ConfigError
from clipcache.tasks.contract import DataSource, EncodeSettings, PromptSettings, ScoreSettings, TaskOptions

OptionsT = TypeVar("OptionsT", bound=TaskOptions)


@dataclass(frozen=True)
class OptionValues:
    """A run's values of task options, by name. A task's ``Options`` take the values of the fields they declare (the
    model's defaults stand for the rest); a swept option (several --fewshot_k) gives one set of options per value."""

    values: Mapping[str, Any]
    swept: Mapping[str, tuple[Any, ...]]

    def for_task(self, options: type[OptionsT]) -> list[OptionsT]:
        """One ``options`` per combination of the swept values it declares (one, when it declares none)."""
        fields = options.model_fields
        given = {name: value for name, value in self.values.items() if name in fields}
        swept = {name: values for name, values in self.swept.items() if name in fields}
        try:
            return [options.model_validate({**given, **dict(zip(swept, combo, strict=True))})
                    for combo in product(*swept.values())]
        except ValidationError as e:
            raise ConfigError("; ".join(_problem(p) for p in e.errors())) from e


def _problem(problem: Any) -> str:
    where = ".".join(str(part) for part in problem["loc"])
    message = str(problem["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


class Evaluation(NamedTuple):
    """One dataset as a run evaluates it: with this split and the class names / captions of this language."""

    dataset: str
    split: str
    language: str


@dataclass(frozen=True, kw_only=True)
class OutputSettings:
    output_dir: str
    template: str | None = None  # --output: clip_benchmark-style JSON as well
    skip_existing: bool = False
    dump_classnames: bool = False
    dump_templates: bool = False


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What every (model, dataset, split, language) of one run is evaluated with."""

    task: str  # auto (each dataset's own) or a registered task
    source: DataSource  # all but the dataset's name, split and language, which each pair sets
    evaluations: tuple[Evaluation, ...]  # every (dataset, split, language), in order: EvaluateParams.evaluations
    prompts: PromptSettings  # all but the language
    encode: EncodeSettings  # without a task's options, which each pair sets
    score: ScoreSettings  # without the device and a task's options, which each pair sets
    options: OptionValues
    output: OutputSettings
    cache_dir: str  # for the command a rescore's cache miss suggests
    amp: bool
    decode: str = "cpu"  # --decode (the model sessions carry it; named here for that command too)
