"""Task options: the experiment identity they make is stored in users' warehouses, so it is pinned here (values
computed from the code before options moved into each task's ``Options`` model); and each default is written once."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest

from clipcache.flows.cli import main
from clipcache.storage.experiment import Experiment

# (task, CLI flags) -> the options JSON of each experiment the run makes, and that experiment's id for a fixed model
# and dataset. Default runs must stay "{}": a stray option drops them off the leaderboard.
PINNED = [
    ("zeroshot_classification", [], ["{}"], ["cd774077a09ef08d"]),
    ("zeroshot_classification", ["--fewshot_k", "5", "--seed", "3", "--ties", "stable", "--batch_size", "32"],
     ["{}"], ["cd774077a09ef08d"]),
    ("zeroshot_retrieval", [], ["{}"], ["f33f3437b70ffc44"]),
    ("zeroshot_retrieval", ["--ties", "stable", "--seed", "4", "--recall_k", "1", "2"], ['{"ties":"stable"}'],
     ["637510bfceceeebb"]),
    ("linear_probe", [], ["{}"], ["d42a175e7d9f8abf"]),
    ("linear_probe", ["--fewshot_lr", "0.1", "--fewshot_epochs", "10", "--seed", "0", "--batch_size", "64",
                      "--train_split", "train", "--ties", "stable"], ["{}"], ["d42a175e7d9f8abf"]),
    ("linear_probe", ["--fewshot_k", "-1", "2", "--fewshot_lr", "0.2", "--fewshot_epochs", "5", "--seed", "3",
                      "--batch_size", "32"],
     ['{"batch_size":32,"fewshot_epochs":5,"fewshot_lr":0.2,"seed":3}',
      '{"batch_size":32,"fewshot_epochs":5,"fewshot_k":2,"fewshot_lr":0.2,"seed":3}'],
     ["91af2c7c957b3144", "5d1b4f684f100123"]),
    ("linear_probe", ["--val_proportion", "0.25", "--train_split", "val"],
     ['{"train_split":"val","val_proportion":0.25}'], ["4a663e16c99bf3b4"]),
    ("linear_probe", ["--val_split", "val"], ['{"val_split":"val"}'], ["a4d30cfb71ffa83f"]),
    ("image_clustering", [], ["{}"], ["3630cb06b891bde8"]),
    ("image_clustering", ["--seed", "2", "--batch_size", "32", "--fewshot_k", "3", "--ties", "stable"],
     ['{"seed":2}'], ["0419c36b8a17f702"]),
    ("text_retrieval", ["--ties", "stable", "--seed", "9"], ["{}"], ["ce77f30f4f986608"]),
    ("any2any_retrieval", ["--seed", "9"], ["{}"], ["4f715f0d094efde4"]),
    ("image_caption_selection", ["--ties", "stable"], ["{}"], ["70d9f26aac4ed114"]),
]


def params_for(task: str, flags: list[str]):
    from clipcache.flows.cli.app import build_parser, params_from_args

    args = build_parser("eval").parse_args(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", *flags])
    params = params_from_args(args)
    return params.model_copy(update={"task": task})


def options_of(params, task: str) -> list[str]:
    """The options JSON of each experiment a run of ``task`` with ``params`` makes, in the run's order."""
    from clipcache.storage.experiment import options_json
    from clipcache.tasks.contract import ScoreSettings
    from clipcache.tasks.evaluation import get_task

    chosen = get_task(task)
    variants = params.run_settings(cached_only=False).options.for_task(chosen.Options)
    return list(dict.fromkeys(options_json(chosen.options(ScoreSettings(options=o))) for o in variants))


def experiment_id(task: str, options: str) -> str:
    return Experiment(model="tiny-shapes-clip", checkpoint="tag:x", dataset="shapes", split="test", language="en",
                      task=task, options=options).id


@pytest.mark.parametrize("task, flags, options, ids", PINNED, ids=[f"{t}-{' '.join(f)}" for t, f, _, _ in PINNED])
def test_experiment_options_and_ids_are_pinned(task, flags, options, ids):
    found = options_of(params_for(task, flags), task)
    assert found == options
    assert [experiment_id(task, o) for o in found] == ids


def test_a_config_number_makes_the_options_it_made_before():
    """An evalscope config's ``fewshot_lr: 1`` (an int) and a float given as a string: the same JSON as before."""
    from clipcache.flows.config.params import EvaluateParams, validate

    base = {"models": [{"model_name": "tiny-shapes-clip"}], "datasets": ["shapes"], "task": "linear_probe"}
    assert options_of(validate(EvaluateParams, {**base, "fewshot_lr": 1}), "linear_probe") == ['{"fewshot_lr":1.0}']
    assert options_of(validate(EvaluateParams, {**base, "val_proportion": "0.5", "seed": 7}), "linear_probe") == \
        ['{"seed":7,"val_proportion":0.5}']


def test_runs_write_the_pinned_experiment_ids(tmp_path, capsys):
    """End to end through the pipeline: a default probe and a swept one, on the bundled model and data."""
    common = ["--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "40", "--task", "linear_probe",
              "--fewshot_epochs", "2", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"),
              "--orchestrator", "local", "--quiet"]
    assert main(["eval", *common, "--fewshot_k", "-1", "1", "--fewshot_lr", "0.05"]) == 0
    capsys.readouterr()
    found = {}
    for path in (tmp_path / "out").rglob("*.json"):
        result = json.loads(path.read_text())
        if "experiment" in result:
            found[result["experiment"]["options"]] = result["experiment_id"]
    assert found == {'{"fewshot_epochs":2,"fewshot_lr":0.05}': "748ce8b80c8cca6b",
                     '{"fewshot_epochs":2,"fewshot_k":1,"fewshot_lr":0.05}': "188a48f4b849d80d"}


# -- each default is written once: in the task's Options model ---------------------------------------------------
def builtin_tasks():
    from clipcache.tasks.evaluation import TASKS, get_task

    return [type(get_task(name)) for name in TASKS.names() if TASKS.get(name).__module__.startswith("clipcache.")]


def test_every_task_option_is_a_run_parameter_that_takes_the_models_default():
    """The flag, the config key and the deployment parameter of each option: its default, constraints and help are
    the Options field's own."""
    from clipcache.flows.cli.app import build_parser
    from clipcache.flows.config.params import OPTION_TASKS, SWEPT_OPTIONS, EvaluateParams

    flags = {s for action in build_parser("eval")._subparsers._group_actions[0].choices["eval"]._actions
             for s in action.option_strings}
    for task in builtin_tasks():
        fields = task.Options.model_fields
        assert not fields or task in OPTION_TASKS, f"{task.name}'s options are not run parameters"
        for name, info in fields.items():
            param = EvaluateParams.model_fields[name]
            assert f"--{name}" in flags
            if name in SWEPT_OPTIONS:
                assert param.default_factory() == [info.default], name
            else:
                assert param.default == info.default and type(param.default) is type(info.default), name
                assert {repr(m) for m in info.metadata} <= {repr(m) for m in param.metadata}, name
            if name != "batch_size":  # the run-wide --batch_size, which the probe also trains with
                assert info.description in param.description, name


def test_the_shared_batch_size_has_one_default():
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.tasks.contract import BATCH_SIZE, EncodeSettings, ScoreSettings
    from clipcache.tasks.evaluation.linear_probe import LinearProbe

    assert (EvaluateParams.model_fields["batch_size"].default == EncodeSettings().batch_size ==
            ScoreSettings().batch_size == LinearProbe.Options().batch_size == BATCH_SIZE)


_UNKNOWN = object()  # a name no built-in task's Options declares (the scan's own test): every comparison counts


def _literal(node: ast.AST | None) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant)


def _named_nodes(node: ast.AST) -> list[str]:
    """The option names ``node`` could give a default to, by the four kinds of copy ``default_sites`` looks for."""
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Dict):
        return list(dict.fromkeys(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)))
    if isinstance(node, ast.keyword) and node.arg:
        return [node.arg]
    if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute):
        return [node.left.attr]
    return []


@functools.cache
def _candidates(repo: Path) -> dict[str, list[tuple[Path, ast.AST]]]:
    """Each file of flows/ and tasks/ parsed once: the nodes that mention a name, by name, in file and walk order."""
    index: dict[str, list[tuple[Path, ast.AST]]] = {}
    for path in sorted(p for top in ("flows", "tasks") for p in (repo / top).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for name in _named_nodes(node):
                index.setdefault(name, []).append((path, node))
    return index


def default_sites(name: str) -> list[str]:
    """Where flows/ and tasks/ give ``name`` a literal value as a default: a class field (plain or ``Field(...)``),
    a dict entry, a keyword argument, or a comparison with ``<something>.name`` (as a command line that leaves out
    defaults would write it)."""
    from conftest import REPO

    default = next((task.Options.model_fields[name].default for task in builtin_tasks()
                    if name in task.Options.model_fields), _UNKNOWN)
    sites = []
    for path, node in _candidates(REPO).get(name, []):
        value: ast.AST | None = None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Field":
                value = value.args[0] if value.args else next(
                    (k.value for k in value.keywords if k.arg == "default"), None)
        elif isinstance(node, ast.Dict):
            value = next((v for k, v in zip(node.keys, node.values, strict=True)
                          if isinstance(k, ast.Constant) and k.value == name), None)
        elif isinstance(node, ast.keyword) and node.arg == name:
            value = node.value
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == name
              and isinstance(node.ops[0], (ast.Eq, ast.NotEq))):
            value = node.comparators[0]
            if default is not _UNKNOWN and _literal(value) and ast.literal_eval(value) != default:
                value = None  # `generation == "beam_search"` tests another value: no copy of the default
        if value is not None and _literal(value):
            sites.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return sites


def test_each_option_default_is_written_once():
    """``fewshot_lr = 0.1`` was written in three places; a copy that drifts gives default runs non-default options,
    and they fall off the leaderboard."""
    names = {name for task in builtin_tasks() for name in task.Options.model_fields} - {"batch_size"}
    assert {"ties", "train_split", "val_split", "val_proportion", "fewshot_k", "fewshot_lr", "fewshot_epochs",
            "seed"} <= names
    twice = {name: sites for name in sorted(names) if len(sites := default_sites(name)) != 1}
    assert not twice, f"an option's default must be written once, in its task's Options: {twice}"


def test_the_default_scan_sees_each_kind_of_copy(tmp_path, monkeypatch):
    tree = ast.parse("class S:\n    seed: int = 0\n    ties: str = Field('topk')\nd = {'seed': 0}\n"
                     "f(fewshot_lr=0.1)\nx = a.train_split == 'train'\n")
    kinds = [type(n).__name__ for n in ast.walk(tree)]
    assert {"AnnAssign", "Dict", "keyword", "Compare"} <= set(kinds)
    import conftest

    (tmp_path / "tasks").mkdir()
    (tmp_path / "flows").mkdir()
    (tmp_path / "tasks" / "copy.py").write_text(ast.unparse(tree))
    monkeypatch.setattr(conftest, "REPO", tmp_path)
    assert [len(default_sites(n)) for n in ("seed", "ties", "fewshot_lr", "train_split")] == [2, 1, 1, 1]


def test_a_task_that_still_declares_option_defaults_is_refused():
    from clipcache.tasks.evaluation.base import EvalTask

    with pytest.raises(TypeError, match="declare the options as a pydantic model"):
        type("Old", (EvalTask,), {"option_defaults": {"seed": 0}})


def test_options_are_validated_by_the_model_before_any_work():
    from clipcache.flows.config.params import EvaluateParams, validate
    from clipcache.storage.errors import ConfigError

    base = {"models": [{"model_name": "tiny-shapes-clip"}], "datasets": ["shapes"]}
    for bad, message in (({"fewshot_k": [2, 0]}, "fewshot_k: 0 samples per class trains nothing"),
                         ({"fewshot_k": [-2]}, "fewshot_k: Input should be greater than or equal to -1"),
                         ({"val_split": "val", "val_proportion": 0.5}, "val_split and val_proportion: give one"),
                         ({"ties": "random"}, "ties: Input should be 'topk' or 'stable'"),
                         ({"fewshot_lr": 0}, "fewshot_lr: Input should be greater than 0")):
        with pytest.raises(ConfigError, match=message):
            validate(EvaluateParams, {**base, **bad})


@pytest.mark.parametrize("task, flags, expected", [
    ("linear_probe", ["--train_split", "val", "--val_split", "test", "--fewshot_lr", "0.2", "--limit", "40"],
     "--task linear_probe --train_split val --val_split test --limit 40"),
    ("linear_probe", ["--train_split", "train", "--seed", "3"], "--task linear_probe"),
    ("zeroshot_retrieval", ["--ties", "stable", "--train_split", "val"], "--task zeroshot_retrieval"),
])
def test_the_rescore_hint_names_the_options_that_choose_what_is_encoded(task, flags, expected):
    """Of the task's options, those its encode step reads (``encode_fields``) where they differ from the defaults."""
    from dataclasses import replace

    from clipcache.flows.orchestration.pipeline import choose_task, eval_command

    params = params_for(task, flags)
    run = params.run_settings(cached_only=True)
    options = run.options.for_task(choose_task(task, "shapes", None).Options)[0]
    command = eval_command(run, params.models[0], replace(run.source, name="shapes"), options)
    assert command == f"clipcache eval --model tiny-shapes-clip --dataset shapes {expected}"


def test_the_rescore_hint_of_an_api_model_carries_its_api_flags():
    """The hint's command encodes what the rescore needs: for an api: model that takes its --api_* settings (the key
    variable's name at most), and the command parses back into the same model."""
    import shlex
    from dataclasses import replace

    from clipcache.flows.cli.app import build_parser, params_from_args
    from clipcache.flows.orchestration.pipeline import choose_task, eval_command

    flags = ["--model", "api:tiny-shapes-clip", "--api_base", "http://127.0.0.1:8010/v1", "--api_revision", "v2",
             "--api_concurrency", "4", "--api_key_env", "MY_KEY", "--dataset", "shapes"]
    params = params_from_args(build_parser("eval").parse_args(["eval", *flags]))
    run = params.run_settings(cached_only=True)
    options = run.options.for_task(choose_task("zeroshot_classification", "shapes", None).Options)[0]
    command = eval_command(run, params.models[0], replace(run.source, name="shapes"), options)
    assert "--api_base http://127.0.0.1:8010/v1" in command and "--api_revision v2" in command
    assert "--api_concurrency 4" in command and "--api_key_env MY_KEY" in command
    again = params_from_args(build_parser("eval").parse_args(shlex.split(command)[1:]))
    assert again.models[0] == params.models[0]


def test_the_docs_tables_of_options_and_metrics_are_derived_from_the_registry():
    """docs/cli.md's task options and docs/metrics.md's catalog are generated (flows/cli/task_tables.py), never typed."""
    from clipcache.flows.cli import task_tables

    for what, (page, make) in task_tables.TABLES.items():
        table = make()
        assert task_tables.stored(what) == task_tables.block(what, table), (
            f"docs/{page}'s {what} table is stale: run `PYTHONPATH=$PWD .venv/bin/python -m clipcache.flows.cli.flags`")
    options = task_tables.options_table()
    assert "| `--fewshot_k` | `-1` (several values: one experiment each) | linear_probe |" in options
    assert "`--batch_size`" not in options  # the run's parameter, which linear_probe also reads
    assert "| `lp_acc` | yes | higher | linear_probe |" in task_tables.metrics_table()
