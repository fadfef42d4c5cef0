"""The nightly deployment's ``params.overrides`` (the ``evaluate-suite`` flow): a typed schema derived from
``EvaluateParams`` and the task registry, which Prefect's own checks (the server's schema check, a worker's parameter
validation) use to refuse a wrong override before the run starts. No server is started: tests/test_deployments.py
runs the deployment for real."""

from __future__ import annotations

import pytest
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import ValidationError as SchemaError
from prefect.utilities.schema_tools import validate as server_check

from clipcache.flows.config.params import EvaluateParams
from clipcache.flows.orchestration.deployments import SuiteOverrides, SuiteParams, load_suite
from clipcache.flows.orchestration.flows import evaluate_suite

from conftest import REPO

NIGHTLY = str(REPO / "suites" / "nightly.yaml")


def _overrides_schema() -> dict:
    return parameter_schema(evaluate_suite).model_dump()["definitions"]["SuiteOverrides"]


def test_the_overrides_schema_lists_every_run_parameter_and_task_option():
    schema = _overrides_schema()
    options = {name for task in EvaluateParams.option_tasks for name in task.Options.model_fields}
    assert set(schema["properties"]) == set(EvaluateParams.model_fields) >= options | {"limit", "datasets"}
    assert schema["additionalProperties"] is False
    assert schema["properties"]["knn_k"]["exclusiveMinimum"] == 0  # the option's own constraint
    assert schema["properties"]["ties"]["enum"] == ["topk", "stable"]
    assert schema["properties"]["knn_k"]["description"] == EvaluateParams.model_fields["knn_k"].description


@pytest.mark.parametrize(("overrides", "field"), [
    ({"limt": 50}, "limt"), ({"limit": 0}, "limit"), ({"knn_k": "three"}, "knn_k"), ({"ties": "bogus"}, "ties")])
def test_a_wrong_override_is_refused_by_the_server_check_and_the_worker(overrides, field):
    given = {"params": {"suite": NIGHTLY, "overrides": overrides}}
    with pytest.raises(SchemaError):
        server_check(given, parameter_schema(evaluate_suite).model_dump(), raise_on_error=True)
    with pytest.raises(ParameterTypeError, match=rf"params\.overrides\.{field}: "):
        evaluate_suite.validate_parameters(given)


def test_a_field_check_refuses_an_override_the_schema_cannot_express():
    for overrides, message in (({"task": "zeroshot_clasification"}, "Did you mean: zeroshot_classification"),
                               ({"split": "../test"}, "is not a plain name")):
        with pytest.raises(ParameterTypeError, match=message):
            evaluate_suite.validate_parameters({"params": {"suite": NIGHTLY, "overrides": overrides}})


def test_overrides_reach_the_run_as_given():
    [params] = evaluate_suite.validate_parameters({"params": {"suite": NIGHTLY, "overrides": {
        "limit": 50, "language": "en", "fewshot_k": 5}}}).values()
    assert isinstance(params.overrides, SuiteOverrides)
    assert params.overrides.given() == {"limit": 50, "language": ["en"], "fewshot_k": [5]}
    run = load_suite(params.suite, params.overrides)
    assert (run.limit, run.language, run.fewshot_k) == (50, ["en"], [5])
    plain = load_suite(params.suite, SuiteOverrides())
    assert plain.limit is None and plain.option_values() == EvaluateParams(
        models=plain.models, datasets=plain.datasets).option_values()  # an unset override keeps the suite's value


def test_a_run_stored_by_prefect_keeps_only_the_overrides_given():
    """Prefect stores a run's parameters as it serialises them (a retry reads them back): an override left out must
    stay out, not come back as null over the suite's value; one given as null stays given."""
    params = SuiteParams(suite=NIGHTLY, overrides={"limit": 50, "output": None})
    stored = evaluate_suite.serialize_parameters({"params": params})
    assert stored == {"params": {"suite": NIGHTLY, "overrides": {"limit": 50, "output": None}}}
    [again] = evaluate_suite.validate_parameters(stored).values()
    assert again.overrides.given() == {"limit": 50, "output": None}
    assert "default" not in _overrides_schema()["properties"]["limit"]  # no form fills in a null
