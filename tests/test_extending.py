"""The worked examples of docs/extending.md, run as written: a new evaluation task, a dataset reader and a model
loader, registered in the process and used through ``evaluate_one`` and the CLI on the bundled shapes data and model.

A Python block of the document belongs to the examples when its first line is ``# example: <name>``. Each test
runs the blocks it names, in order, in one namespace (a throwaway module), in a fresh working directory, and then
puts the registries (module-level state) back as they were.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from clipcache.flows.config.params import EvaluateParams
from clipcache.storage.errors import ConfigError
from clipcache.tasks.datasets import DATASETS
from clipcache.tasks.evaluation import TASKS
from clipcache.tasks.models import LOADERS

from conftest import REPO

DOC = REPO / "docs" / "extending.md"
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.MULTILINE | re.DOTALL)
MARK = re.compile(r"# example: (?P<name>[\w-]+)\n")


def examples() -> dict[str, str]:
    found: dict[str, str] = {}
    for block in BLOCK.finditer(DOC.read_text(encoding="utf-8")):
        code = block["code"]
        if (mark := MARK.match(code)) is not None:
            assert mark["name"] not in found, f"two examples named {mark['name']!r} in {DOC.name}"
            found[mark["name"]] = code
    return found


@pytest.fixture
def run_examples(tmp_path, monkeypatch):
    """Run named examples in a fresh directory; registrations they add are removed after."""
    monkeypatch.chdir(tmp_path)
    for registry in (TASKS, DATASETS, LOADERS):
        registry.names()  # read installed plugins now, so that restoring below keeps them
    saved = [(d, dict(d)) for r in (TASKS, DATASETS, LOADERS) for d in (r._entries, r._origin)]
    module = types.ModuleType("extending_examples")
    sys.modules[module.__name__] = module  # dataclasses look up the defining module

    def run(*names: str) -> dict:
        code = examples()
        for name in names:
            exec(compile(code[name], f"{DOC}:{name}", "exec"), module.__dict__)
        return module.__dict__

    yield run
    sys.modules.pop(module.__name__, None)
    for target, copy in saved:
        target.clear()
        target.update(copy)


def test_every_example_is_run_by_a_test():
    ran = {"task-define", "task-check", "task-run", "task-cli", "task-option", "dataset-reader", "dataset-data",
           "dataset-cli", "model-loader", "model-cli"}
    assert set(examples()) == ran


def test_new_task_checked_and_run_with_evaluate_one(run_examples):
    ns = run_examples("task-define", "task-check", "task-run")
    assert set(ns["scored"].metrics) == {"image_knn_precision@1", "image_knn_precision@10"}


def test_new_task_through_the_cli_shares_the_image_entry(run_examples):
    run_examples("task-define", "task-cli")
    assert Path("outputs/tiny-shapes-clip/shapes_zeroshot_classification.limit300.json").is_file()


def test_new_task_option_is_a_flag_and_another_experiment(run_examples):
    run_examples("task-define", "task-cli", "task-option")


def test_a_new_task_with_options_touches_no_other_file(run_examples):
    """The task's module and its registration are all it takes: its option is a run parameter and a flag, its metric
    and sample rows are in the catalog and the docs' generated tables would list them, and nothing stored or listed by
    hand (flows/eval_flags.json, the parameter model, a metric table) has to change with it."""
    from clipcache.flows.cli import flags as cli_flags
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.tasks.evaluation import metric_catalog

    run_examples("task-define")
    assert "image_knn_include_self" in EvaluateParams.for_registry().model_fields
    assert "image_knn_include_self" not in EvaluateParams.model_fields  # clipcache's own model is left as it was
    assert metric_catalog()["image_knn_precision"].higher_is_better
    assert [s.unit for s in TASKS.get("image_knn").samples] == ["image"]
    assert cli_flags.stored_description() == cli_flags.live_description()
    flags = {s for a in cli_flags_parser()._actions for s in a.option_strings}
    assert "--image_knn_include_self" in flags


def test_a_new_tasks_option_is_a_key_of_an_evalscope_task_config(run_examples, tmp_path):
    """The task's option is settable from an evalscope config as from its flag, checked as the flag is."""
    from clipcache.flows.config.evalscope import parse_task_config
    from clipcache.tasks.contract import ScoreSettings

    def config(**keys) -> dict:
        return {"eval_config": {"tool": "clip_benchmark", "eval": {
            "models": [{"model_name": "tiny-shapes-clip"}], "dataset_name": ["shapes"], "task": "image_knn", **keys}}}

    with pytest.raises(ConfigError, match="eval_config.eval.image_knn_include_self: unknown key"):
        parse_task_config(config(image_knn_include_self=True))  # not registered yet
    run_examples("task-define")
    task = TASKS.get("image_knn")()
    for given, expected in ((config(), {}), (config(image_knn_include_self=True), {"image_knn_include_self": True})):
        [params] = parse_task_config(given)
        [options] = params.run_settings(cached_only=False).options.for_task(task.Options)
        assert task.options(ScoreSettings(options=options)) == expected
    with pytest.raises(ConfigError, match="eval_config.eval.image_knn_include_self: Input should be a valid boolean"):
        parse_task_config(config(image_knn_include_self="sometimes"))


def test_a_task_registered_in_the_process_joins_the_flows_parameter_schema(run_examples):
    """What `launch.evaluate` does before a Prefect run: the flow's parameter takes the registry's model, and back
    once the task is gone (tests/test_plugins.py checks deployments of an installed plugin's task)."""
    from prefect.utilities.callables import parameter_schema

    from clipcache.flows.orchestration.deployments import with_registry_options
    from clipcache.flows.orchestration.flows import evaluate

    def options() -> set[str]:
        return set(parameter_schema(evaluate).definitions["EvaluateParams"]["properties"])

    assert "image_knn_include_self" not in options()
    run_examples("task-define")
    assert "image_knn_include_self" not in options()  # flows.py was loaded before the task was registered
    with_registry_options(evaluate)
    assert "image_knn_include_self" in options()
    plain = EvaluateParams(models=[{"model_name": "tiny-shapes-clip"}], datasets=["shapes"], limit=3)
    [given] = evaluate.validate_parameters({"params": plain}).values()
    assert given.limit == 3 and given.image_knn_include_self is False
    TASKS._entries.pop("image_knn")
    with_registry_options(evaluate)
    assert "image_knn_include_self" not in options()


def cli_flags_parser():
    from clipcache.flows.cli import app
    from clipcache.flows.cli import flags as cli_flags

    parser = app.OneLineParser(prog="clipcache eval")
    cli_flags.add_flags(parser)
    return parser


def test_new_task_refuses_a_retrieval_dataset_in_one_line(run_examples, capsys):
    ns = run_examples("task-define")
    from clipcache.flows.cli import main

    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes_retrieval", "--task", "image_knn",
                 "--limit", "20", "--orchestrator", "local", "--quiet"])
    assert code == 1 and "task image_knn needs a single-label classification dataset" in capsys.readouterr().err
    with pytest.raises(ns["ConfigError"], match="needs every k below the number of images"):
        ns["knn_precision"](ns["np"].eye(3), ns["np"].arange(3), [3])


def test_dataset_reader_gives_the_builtin_numbers(run_examples):
    run_examples("dataset-reader", "dataset-data", "dataset-cli")


def test_dataset_reader_names_a_bad_label(run_examples):
    ns = run_examples("dataset-reader", "dataset-data")
    np = ns["np"]
    np.save("my_npy/test_labels.npy", np.full(200, 30))
    from clipcache.tasks.datasets import open_dataset

    with pytest.raises(ns["DatasetError"], match=r"test_labels.npy row 0: label 30 is not a class index"):
        open_dataset("npy_images", "my_npy", "test", None)


def test_model_loader_by_short_name(run_examples):
    run_examples("model-loader", "model-cli")


def test_registrations_are_gone_after_a_test():
    assert "image_knn" not in TASKS and "npy_images" not in DATASETS and "zoo" not in LOADERS
    from clipcache.tasks.evaluation import metric_catalog

    assert "image_knn_precision" not in metric_catalog()
    assert "image_knn_include_self" not in EvaluateParams.for_registry().model_fields
