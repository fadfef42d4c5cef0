"""Scheduled evaluation: the ``evaluate-suite`` flow's parameters and serving the deployments declared in ``prefect.yaml``.

``prefect.yaml`` is the one place deployments are declared. Two ways to run them:

- ``clipcache serve``: one long-lived process registers every deployment (with its schedules) and runs their flow
  runs itself (Prefect's ``serve``); nothing else to set up.
- ``prefect deploy --all`` + ``prefect worker start --pool clipcache``: the work-pool path, where workers (on this or
  other machines) pick up scheduled and triggered runs.

Entrypoints are module paths (``clipcache.flows.orchestration.flows:evaluate_suite``), so deployments load from wherever the
package is installed; a file path (``path/to/flows.py:flow``) is taken relative to the ``prefect.yaml``. Without a
checkout, ``clipcache init DIR`` writes the shipped ``prefect.yaml`` and ``suites/nightly.yaml`` (flows/cli/init.py).

A suite file is a YAML (or JSON) mapping with the ``evaluate`` flow's parameters (``EvaluateParams``: models,
datasets, cache_dir, output_dir, ...) or an evalscope task config; it is read and validated when the run starts, so
editing the file changes the next nightly run without redeploying.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Annotated, Any, cast

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    create_model,
    field_validator,
    model_serializer,
)

from clipcache.flows.config.evalscope import load_task_config, to_evaluate_params
from clipcache.flows.config.params import EvaluateParams, validate
from clipcache.flows.config.task_params import FROM_ANOTHER_REGISTRY as _FROM_ANOTHER
from clipcache.storage.errors import ConfigError, parse_problem

DEFAULT_PREFECT_FILE = "prefect.yaml"


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # an override left out is the suite's value, not null: no form fills one in


def _overrides_fields(params: type[BaseModel], names: Iterable[str]) -> dict[str, Any]:
    """``create_model`` fields: the parameters ``names`` of ``params``, each optional (left out: the suite's value),
    with its type, constraints and help."""
    fields: dict[str, Any] = {}
    for name in names:
        info = params.model_fields[name]
        annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields[name] = (annotation, Field(None, description=info.description, json_schema_extra=_no_default))
    return fields


def _field_checks(params: type[BaseModel]) -> dict[str, Any]:
    """The field validators of ``params`` (a bare language, a known task, a plain split, ...), for the same fields."""
    checks = params.__pydantic_decorators__.field_validators.items()  # each bound to params: take its function
    return {name: field_validator(*d.info.fields, mode=d.info.mode)(cast(Any, d.func).__func__) for name, d in checks}


# every EvaluateParams parameter, optional, with its field checks (a base of SuiteOverrides, as the task options of
# EvaluateParams)
_OverrideFields: Any = create_model("SuiteOverrideFields", __module__=__name__,
                                    __validators__=_field_checks(EvaluateParams),
                                    **_overrides_fields(EvaluateParams, EvaluateParams.model_fields))


class SuiteOverrides(_OverrideFields):
    """A suite run's overrides (``evaluate-suite``'s ``params.overrides``): any ``EvaluateParams`` parameter, each
    checked as that field is (type, constraints, field validators); a run's checks across fields (known datasets,
    models, task options) run with the suite's parameters when the run starts. Derived from ``EvaluateParams``, task
    options included; ``for_registry()`` adds the options of tasks registered besides clipcache's own."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    @classmethod
    def for_registry(cls) -> type[SuiteOverrides]:
        return _registry_overrides(EvaluateParams.for_registry())

    def given(self) -> dict[str, Any]:
        """The parameters given, as validated."""
        return self.model_dump()

    @model_serializer(mode="wrap")
    def _given_only(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only what was given, however it is serialised: Prefect stores a run's parameters as dumped, and a run
        retried from them must not override every parameter with null."""
        return {name: value for name, value in dump(self).items() if name in self.model_fields_set}


@cache
def _registry_overrides(params: type[EvaluateParams]) -> type[SuiteOverrides]:
    if params is EvaluateParams:
        return SuiteOverrides
    extra = [name for name in params.model_fields if name not in EvaluateParams.model_fields]
    return create_model("SuiteOverrides", __base__=SuiteOverrides, __module__=__name__,
                        __validators__={"_from_another_registry": _FROM_ANOTHER}, **_overrides_fields(params, extra))


class SuiteParams(BaseModel):
    """Parameters of the ``evaluate-suite`` flow (the nightly deployment's parameter schema)."""

    model_config = ConfigDict(extra="forbid")

    suite: str = Field("suites/nightly.yaml", description="YAML/JSON file with the evaluate flow's parameters, or "
                                                          "an evalscope task config")
    overrides: SuiteOverrides = Field(default_factory=SuiteOverrides, description="parameters replacing the "
                                      "suite's, e.g. {limit: 100}")

    @classmethod
    def for_registry(cls) -> type[SuiteParams]:
        """This model, its overrides taking the options of every task registered besides clipcache's own."""
        return _registry_suite(SuiteOverrides.for_registry())


@cache
def _registry_suite(overrides: type[SuiteOverrides]) -> type[SuiteParams]:
    if overrides is SuiteOverrides:
        return SuiteParams
    return create_model("SuiteParams", __base__=SuiteParams, __module__=__name__,
                        __validators__={"_from_another_registry": _FROM_ANOTHER},
                        overrides=(overrides, Field(default_factory=overrides, description=SuiteParams.model_fields[
                            "overrides"].description)))


def load_suite(path: str | Path, overrides: SuiteOverrides | dict[str, Any] | None = None) -> EvaluateParams:
    data = load_task_config(str(path))
    given = overrides.given() if isinstance(overrides, SuiteOverrides) else overrides or {}
    if "eval_config" in data:
        params = to_evaluate_params(data)
        return validate(EvaluateParams.for_registry(), {**params.model_dump(), **given}, prefix=f"{path}: ")
    return validate(EvaluateParams.for_registry(), {**data, **given}, prefix=f"{path}: ")


def read_deployments(prefect_file: str | Path = DEFAULT_PREFECT_FILE) -> list[dict[str, Any]]:
    path = Path(prefect_file)
    if not path.is_file():
        raise ConfigError(f"{path} not found: run from the project folder, pass --prefect_file, or write one with "
                          f"`clipcache init`")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start + 1}); save it as UTF-8") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {parse_problem(e)}") from e
    deployments = doc.get("deployments")
    if not isinstance(deployments, list) or not deployments:
        raise ConfigError(f"{path}: no deployments declared")
    for i, d in enumerate(deployments):
        for key in ("name", "entrypoint"):
            if not isinstance(d, dict) or not d.get(key):
                raise ConfigError(f"{path}: deployments[{i}].{key} is missing")
    return deployments


def with_registry_options(flow_obj: Any) -> Any:
    """``flow_obj`` with its ``EvaluateParams`` parameter (the evaluate and rescore flows') typed as the registry's
    model, ``EvaluateParams.for_registry()``, and its ``SuiteParams`` one (evaluate-suite's) as
    ``SuiteParams.for_registry()``: the options of tasks from installed plugins are parameters too. Prefect
    builds a deployment's parameter schema from the flow's signature (``to_deployment``, ``serve``, ``prefect
    deploy``) and validates a run's parameters against it, so the signature must name that model; flows.py applies
    this when it is imported, which is when a deployment, worker or ``serve`` loads its entrypoint. Other flows are
    returned as they are; call it again after registering a task in the process."""
    import inspect

    from prefect.utilities.callables import parameter_schema

    fn = flow_obj.fn
    signature = inspect.signature(fn, eval_str=True)
    models = [(EvaluateParams, EvaluateParams.for_registry()), (SuiteParams, SuiteParams.for_registry())]

    def retyped(p: inspect.Parameter) -> inspect.Parameter:
        for base, model in models:
            if isinstance(p.annotation, type) and issubclass(p.annotation, base) and p.annotation is not model:
                return p.replace(annotation=model)
        return p

    parameters = [retyped(p) for p in signature.parameters.values()]
    if parameters != list(signature.parameters.values()):
        fn.__signature__ = signature.replace(parameters=parameters)
        flow_obj.parameters = parameter_schema(fn)
    return flow_obj


def runner_deployments(prefect_file: str | Path = DEFAULT_PREFECT_FILE, names: list[str] | None = None) -> list:
    """``prefect.yaml``'s deployments as deployments served by this process (same names, parameters, schedules)."""
    from prefect.flows import load_flow_from_entrypoint
    from prefect.schedules import Cron, Interval

    base = Path(prefect_file).resolve().parent
    chosen = [d for d in read_deployments(prefect_file) if not names or d["name"] in names]
    missing = set(names or []) - {d["name"] for d in chosen}
    if missing:
        raise ConfigError(f"no deployment named {', '.join(sorted(missing))} in {prefect_file}")
    out = []
    for d in chosen:
        entrypoint = d["entrypoint"]
        if ".py:" in entrypoint:  # a script, relative to prefect.yaml; otherwise a module path
            file, _, func = entrypoint.rpartition(":")
            entrypoint = f"{base / file}:{func}"
        flow_obj: Any = with_registry_options(load_flow_from_entrypoint(entrypoint, use_placeholder_flow=False))
        schedules = []
        for s in d.get("schedules") or []:
            if s.get("cron"):
                schedules.append(Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True)))
            elif s.get("interval"):
                schedules.append(Interval(s["interval"], timezone=s.get("timezone"), active=s.get("active", True)))
        out.append(flow_obj.to_deployment(name=d["name"], parameters=d.get("parameters") or {},
                                          schedules=schedules or None, description=d.get("description"),
                                          tags=d.get("tags")))
    return out


def serve_deployments(prefect_file: str | Path = DEFAULT_PREFECT_FILE, names: list[str] | None = None,
                      limit: int | None = None) -> None:
    from prefect import serve
    from prefect.settings import PREFECT_API_URL

    # Prefect's ephemeral server (what runs without PREFECT_API_URL) has no scheduler: schedules would never fire.
    if not PREFECT_API_URL.value():
        raise ConfigError("clipcache serve needs a Prefect server for its schedules: run `prefect server start` and "
                          "export PREFECT_API_URL=http://127.0.0.1:4200/api (or your server's URL)")
    deployments = runner_deployments(prefect_file, names)
    _refuse_pool_deployments(deployments)
    serve(*deployments, limit=limit)


def _refuse_pool_deployments(deployments: list) -> None:
    """`serve` registers its deployments under their names, without a work pool or pull steps: over one that
    `prefect deploy` put in a work pool, it would silently take it from the pool's workers (their runs then fail,
    and both would fire the schedule). So a deployment is either served or deployed, never both."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    taken = []
    with get_client(sync_client=True) as client:
        for d in deployments:
            try:
                existing = client.read_deployment_by_name(f"{d.flow_name}/{d.name}")
            except ObjectNotFound:
                continue
            if existing.work_pool_name:
                taken.append(f"{d.flow_name}/{d.name} (work pool {existing.work_pool_name!r})")
    if taken:
        one = len(taken) == 1
        raise ConfigError(f"{', '.join(taken)} {'is' if one else 'are'} deployed to a work pool by `prefect deploy`; "
                          f"serving {'it' if one else 'them'} here would take {'it' if one else 'them'} from the "
                          f"pool's workers. Serve other deployments (--deployment NAME), or delete a deployment first "
                          f"to switch it (`prefect deployment delete {taken[0].split(' ')[0]}`)")
