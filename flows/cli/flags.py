"""The eval / rescore flags as data, so that ``clipcache eval --help`` and a name error build them without importing
the parameter models (pydantic, the task contract, every task's Options: about half a second).

The description is generated from the live models and registries (flows/cli/app.py ``eval_flags`` over
flows/config/params.py's ``EvaluateParams``, the API fields, the task and model-loader registries) and kept in
flows/cli/eval_flags.json; tests/test_cli_flags.py holds the two equal. After adding or changing a parameter:

    PYTHONPATH=$PWD .venv/bin/python -m clipcache.flows.cli.flags      # rewrites flows/cli/eval_flags.json

Choices drawn from a registry that other packages extend (``--task``, ``--model_type``) keep the built-in names
here and gain the installed plugins' names from their entry point group when the parser is built.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

FLAGS_FILE = Path(__file__).with_name("eval_flags.json")
TYPES = {"int": int, "float": float}
# choices that other packages extend: the flag's destination -> (entry point group, names before the registry's)
PLUGIN_CHOICES = {"task": ("clipcache.tasks", ["auto"]), "model_type": ("clipcache.models", ["auto"])}
# The live registry of each extensible flag: names registered in this process (a test, a notebook, a plugin's own
# code) count when that registry is already imported; it is never imported for this.
LIVE_REGISTRIES = {"task": ("clipcache.tasks.evaluation", "TASKS"), "model_type": ("clipcache.tasks.models", "LOADERS")}


class Recorder:
    """Stands in for an argparse parser while the live flags are declared: keeps every call as data."""

    def __init__(self, calls: list[dict[str, Any]] | None = None, group: str | None = None,
                 exclusive: int | None = None):
        self.calls = [] if calls is None else calls
        self.group, self.exclusive = group, exclusive
        self._next_exclusive = 0

    def add_argument_group(self, title: str) -> Recorder:
        return Recorder(self.calls, title)

    def add_mutually_exclusive_group(self) -> Recorder:
        self._next_exclusive += 1
        return Recorder(self.calls, self.group, self._next_exclusive)

    def add_argument(self, *names: str, **kwargs: Any) -> None:
        if "type" in kwargs:
            kwargs["type"] = next(name for name, t in TYPES.items() if t is kwargs["type"])
        self.calls.append({"names": list(names), "group": self.group, "exclusive": self.exclusive,
                           "kwargs": kwargs})


def live_description() -> list[dict[str, Any]]:
    """The flags as flows/cli/app.py declares them from the live models (imports the parameter models)."""
    from clipcache.flows.cli.app import eval_flags

    recorder = Recorder()
    eval_flags(recorder, builtin_only=True)
    return json.loads(json.dumps(recorder.calls))  # as read back from the file: tuples become lists


def stored_description() -> list[dict[str, Any]] | None:
    try:
        data = json.loads(FLAGS_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, list) else None


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Declare the eval / rescore flags on ``parser`` from the stored description (the live models when it is
    missing or unreadable)."""
    calls = stored_description()
    if calls is None:
        from clipcache.flows.cli.app import eval_flags

        eval_flags(parser)
        return
    groups: dict[Any, Any] = {}
    for call in calls:
        target: Any = parser
        if call["group"] is not None:
            if call["group"] not in groups:
                groups[call["group"]] = parser.add_argument_group(call["group"])
            target = groups[call["group"]]
        if call["exclusive"] is not None:
            key = (call["group"], call["exclusive"])
            if key not in groups:
                groups[key] = target.add_mutually_exclusive_group()
            target = groups[key]
        kwargs = dict(call["kwargs"])
        if "type" in kwargs:
            kwargs["type"] = TYPES[kwargs["type"]]
        if kwargs.get("dest") in PLUGIN_CHOICES and "choices" in kwargs:
            builtin = kwargs.pop("choices")
            kwargs["type"] = RegistryChoice(kwargs["dest"], builtin)
            kwargs["metavar"] = "{" + ",".join(builtin) + ",...}"
            kwargs["help"] += " (or a name an installed plugin registers)"
        target.add_argument(*call["names"], **kwargs)


class RegistryChoice:
    """A flag value from a registry other packages extend: a built-in name is taken as it is; any other is looked
    up among the installed plugins' names (importlib.metadata: a tenth of a second, paid only then)."""

    def __init__(self, dest: str, builtin: list[str]):
        self.dest, self.builtin = dest, builtin
        self.__name__ = dest  # argparse names the type in its messages

    def __call__(self, value: str) -> str:
        if value in self.builtin:
            return value
        from importlib.metadata import entry_points

        group, _ = PLUGIN_CHOICES[self.dest]
        extra = {ep.name for ep in entry_points(group=group)}
        module_name, attribute = LIVE_REGISTRIES[self.dest]
        if (module := sys.modules.get(module_name)) is not None:
            extra |= set(getattr(module, attribute).names())
        names = self.builtin + sorted(extra - set(self.builtin))
        if value in names:
            return value
        # argparse's own wording, which OneLineParser turns into one line with the closest name
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from "
                                         f"{', '.join(repr(n) for n in names)})")


def main() -> int:
    FLAGS_FILE.write_text(json.dumps(live_description(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {FLAGS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
