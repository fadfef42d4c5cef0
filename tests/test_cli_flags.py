"""The eval / rescore flags from their stored description (flows/cli/eval_flags.json) equal the live parameter models'
and parse alike; `eval --help` and a bad name import nothing heavy; no help text of any subcommand shows a doubled
``%%``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clipcache.flows.cli import app as cli
from clipcache.flows.cli import flags as cli_flags

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pydantic", "prefect", "clipcache.flows.config.params", "clipcache.tasks.contract", "numpy", "open_clip",
         "rich.console")


def test_stored_description_equals_the_live_models():
    assert cli_flags.stored_description() == cli_flags.live_description(), (
        "flows/cli/eval_flags.json is stale: run `PYTHONPATH=$PWD .venv/bin/python -m clipcache.flows.cli.flags`")


def live_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(prog="clipcache eval")
    cli_flags.eval_flags(parser)
    return parser


def stored_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(prog="clipcache eval")
    cli_flags.add_flags(parser)
    return parser


@pytest.mark.parametrize("argv", [
    [],
    ["--model", "a", "b", "--pretrained", "x.bin", "--dataset", "shapes", "cifar10", "--recall_k", "1", "5", "10",
     "--task", "zeroshot_retrieval", "--model_type", "open_clip", "--no_amp", "--bootstrap", "0", "--ties", "stable",
     "--fewshot_k", "1", "5", "--val_proportion", "0.2", "--skip-existing", "--quiet", "--orchestrator", "local"],
    ["--amp", "--api_concurrency", "3", "--model-type", "glossary_clip"],  # a plugin's loader name
])
def test_both_parsers_parse_alike(argv):
    assert vars(stored_parser().parse_args(argv)) == vars(live_parser().parse_args(argv))


def test_a_mistyped_registry_name_is_one_line_with_the_closest(capsys):
    for flag, given, close in (("--task", "zeroshot_clasification", "zeroshot_classification"),
                               ("--model_type", "glossary_clp", "glossary_clip")):
        with pytest.raises(SystemExit) as done:
            stored_parser().parse_args([flag, given])
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.count("\n") == 1 and f"Did you mean {close}?" in err, err


def test_a_missing_description_falls_back_to_the_live_models(monkeypatch, tmp_path):
    monkeypatch.setattr(cli_flags, "FLAGS_FILE", tmp_path / "missing.json")
    assert vars(stored_parser().parse_args(["--task", "linear_probe"])) == \
        vars(live_parser().parse_args(["--task", "linear_probe"]))


def imported_by(argv: list[str]) -> tuple[int, list[str]]:
    code = (f"import sys, json\nfrom clipcache.flows.cli import main\ntry:\n    rc = main({argv!r})\n"
            "except SystemExit as e:\n    rc = e.code\nprint(json.dumps([rc, sorted(sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    rc, modules = json.loads(done.stdout.strip().splitlines()[-1])
    return rc, modules


@pytest.mark.parametrize("argv", [["eval", "--help"], ["rescore", "--help"],
                                  ["eval", "--model", "m", "--task", "zeroshot_clasification"]])
def test_help_and_a_bad_name_import_nothing_heavy(argv):
    rc, modules = imported_by(argv)
    assert rc in (0, 2)
    assert not [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY], argv


def subcommand_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)command's parser, each built in full as its own invocation builds it."""
    def walk(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
        found = [(path, parser)]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found += walk(child, f"{path} {name}")
        return found

    names = [a for a in cli.build_parser(None)._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for name in names:
        top = cli.build_parser(name)
        sub = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)][0]
        out += walk(sub.choices[name], name)
    return [("clipcache", cli.build_parser(None)), *out]


def test_no_help_text_shows_a_doubled_percent():
    parsers = subcommand_parsers()
    assert len(parsers) > 20 and {"eval", "compare", "suite", "suite score"} <= {p for p, _ in parsers}
    for path, parser in parsers:
        assert "%%" not in parser.format_help(), path


def test_plugin_task_flags_are_looked_up_only_when_the_arguments_may_use_them():
    """Reading the installed packages' entry points costs more than the stored flags: an ordinary command line never
    pays it; --help, a flag the stored ones lack, or unknown arguments (a parser built for tests) do."""
    stored = {name for call in cli_flags.stored_description() for name in call["names"]}
    assert not cli_flags.wants_plugin_flags(["eval", "--model", "m", "--fewshot_k", "1", "5", "--seed=3"], stored)
    assert cli_flags.wants_plugin_flags(["eval", "--help"], stored)
    assert cli_flags.wants_plugin_flags(["eval", "--image_knn_include_self"], stored)
    assert cli_flags.wants_plugin_flags(None, stored)
    assert "options of tasks from plugins" not in stored_parser().format_help()  # no plugin task installed here


COMMAND_MODULES = {"cache", "catalog", "compare", "init", "query", "server", "suite"}


@pytest.mark.parametrize("argv, built", [(["eval", "--help"], set()), (["--help"], set()),
                                         (["compare", "--help"], {"compare"}), (["evl"], set()),
                                         (["datasets", "--bogus"], {"catalog"})])
def test_a_command_line_builds_only_its_commands_parser(argv, built):
    """Only the command run has its parser built (and its module imported); the others are named with their help
    line, which is all `clipcache --help` and a mistyped command's suggestion need."""
    rc, modules = imported_by(argv)
    assert rc in (0, 2)
    assert {m.rpartition(".")[2] for m in modules if m.startswith("clipcache.flows.cli.")} & COMMAND_MODULES == built


def test_every_command_is_listed_alike_whichever_is_built():
    from clipcache.flows.cli.commands import COMMANDS

    def listing(command: str | None) -> list[tuple[str, str | None]]:
        [sub] = [a for a in cli.build_parser(command)._actions if isinstance(a, argparse._SubParsersAction)]
        return [(a.dest, a.help) for a in sub._choices_actions]

    names = [(name, command.help) for name, command in COMMANDS.items()]
    assert listing(None) == names and all(listing(name) == names for name in COMMANDS)
