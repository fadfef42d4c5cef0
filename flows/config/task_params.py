"""Task options as run parameters, derived from the task registry: every field of a registered task's ``Options``
is a run parameter of the same name (a ``clipcache eval`` flag, an evalscope / suite config key, a deployment
parameter), with the field's own type, default, constraints and help. Nothing here names a task.

- Options of several tasks that share a name share one parameter; they must be declared alike (type, default,
  constraints, swept or not), and its help names every task that reads it.
- An option named like a run-wide parameter (``batch_size``) takes the run's value.
- A swept option (``TaskOptions.swept``) takes a list of values, or one value: one experiment per distinct value.

clipcache's own tasks give ``EvaluateParams`` its option fields (flows/config/params.py), in the order the tasks are
registered; tasks registered besides them (installed plugins' entry points, or ``TASKS.register`` in the process)
add theirs in ``EvaluateParams.for_registry()`` (``extended_model``), a subclass built when a run is validated.
"""

from __future__ import annotations

from collections.abc import Iterable
from copy import copy
from typing import TYPE_CHECKING, Annotated, Any, cast

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, create_model, model_validator
from pydantic.fields import FieldInfo

from clipcache.storage.errors import ClipcacheError, ConfigError

if TYPE_CHECKING:
    from clipcache.tasks.evaluation.base import EvalTask


def builtin_tasks() -> list[type[EvalTask]]:
    """clipcache's own task classes, in registration order."""
    from clipcache.tasks.evaluation import BUILTIN_TASKS, get_task

    return [type(get_task(name)) for name in BUILTIN_TASKS]


def extra_tasks() -> list[type[EvalTask]]:
    """The task classes registered besides clipcache's own (installed plugins, ``TASKS.register`` in the process).
    One that cannot be imported is left out here: its error is reported when a run names it."""
    from clipcache.tasks.evaluation import BUILTIN_TASKS, TASKS, get_task

    found = []
    for name in TASKS.in_order():
        if name in BUILTIN_TASKS:
            continue
        try:
            found.append(type(get_task(name)))
        except ClipcacheError:
            continue
    return found


def _declaration(info: FieldInfo, swept: bool) -> tuple[Any, ...]:
    return info.annotation, info.default, info.default_factory, repr(info.metadata), swept


def _one_or_several(value: object) -> object:
    return [value] if isinstance(value, (int, float, str)) else value  # --fewshot_k 5, or fewshot_k: 5 in a config


def _distinct(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def option_parameters(tasks: Iterable[type[EvalTask]], taken: Iterable[str] = ()) -> dict[str, tuple[Any, Any]]:
    """``create_model`` fields: one run parameter per option of ``tasks`` (in their order, each task's fields in
    theirs), leaving out the names in ``taken`` (run-wide parameters, or options already parameters)."""
    owners: dict[str, list[type[EvalTask]]] = {}
    for task in tasks:
        for name in task.Options.model_fields:
            owners.setdefault(name, []).append(task)
    fields: dict[str, tuple[Any, Any]] = {}
    for name, (first, *also) in owners.items():
        info = first.Options.model_fields[name]
        swept = name in first.Options.swept
        for other in also:
            if _declaration(other.Options.model_fields[name], name in other.Options.swept) != \
                    _declaration(info, swept):
                raise ConfigError(f"task {other.name} declares option {name!r} differently from task {first.name}: "
                                  f"options of the same name are one run parameter (--{name}); rename one or "
                                  f"declare both alike")
        if name in taken:
            continue
        readers = ", ".join(t.name for t in (first, *also))
        if swept:
            several = first.Options.swept[name]
            values = list[info.annotation]  # type: ignore[name-defined]
            fields[name] = (Annotated[values, BeforeValidator(_one_or_several), AfterValidator(_distinct)],
                            Field(default_factory=lambda d=info.default: [d], min_length=1,
                                  description=f"{readers}: {info.description}; {several}"))
        else:
            shared = copy(info)
            shared.description = f"{readers}: {info.description}"
            fields[name] = (info.annotation, shared)
    return fields


def swept_names(tasks: Iterable[type[EvalTask]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for task in tasks for name in task.Options.swept))


def options_model(tasks: list[type[EvalTask]], taken: Iterable[str]) -> type[BaseModel]:
    """A model whose fields are the run parameters of ``tasks``' options (a base of ``EvaluateParams``)."""
    fields: dict[str, Any] = option_parameters(tasks, taken)
    return create_model("TaskOptionParams", __module__=__name__, **fields)


_EXTENDED: dict[tuple[Any, ...], type[BaseModel]] = {}


def _from_another_registry(cls: Any, data: Any) -> Any:
    """An instance of the model's base (``EvaluateParams(...)`` given to a flow whose parameter is this model, as in
    docs/production.md) or of a model built for other registered tasks is taken by the values it was given."""
    if isinstance(data, cls.__mro__[1]) and not isinstance(data, cls):
        return {name: getattr(data, name) for name in data.model_fields_set}
    return data


# a classmethod (its first argument: cls); flows/orchestration/deployments.py's registry models take it too
FROM_ANOTHER_REGISTRY: Any = model_validator(mode="before")(_from_another_registry)


def extended_model(base: Any) -> Any:
    """``base`` (EvaluateParams), with the options of every task registered besides clipcache's own as further
    parameters; ``base`` itself when there are none. Built once per set of registered tasks."""
    extra = extra_tasks()
    key = (base, *extra)
    if key not in _EXTENDED:
        known = [*base.option_tasks, *extra]
        option_parameters(known)  # a plugin option declared unlike a built-in one of its name: one clear line
        fields: dict[str, Any] = option_parameters(extra, taken=base.model_fields)
        if not fields and not extra:
            return base
        model = cast(Any, create_model(base.__name__, __base__=base, __module__=base.__module__,
                                       __validators__={"_from_another_registry": FROM_ANOTHER_REGISTRY}, **fields))
        model.option_tasks = tuple(known)
        model.swept_options = swept_names(known)
        _EXTENDED[key] = model
    return _EXTENDED[key]

