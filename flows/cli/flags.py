"""The eval / rescore flags as data, so that ``clipcache eval --help`` and a name error build them without importing
the parameter models (pydantic, the task contract, every task's Options: about half a second).

The description is generated from the live models and registries (``eval_flags`` below, over
flows/config/params.py's ``EvaluateParams``, the API fields, the task and model-loader registries) and kept in
flows/cli/eval_flags.json; tests/test_cli_flags.py holds the two equal. After adding or changing a parameter:

    PYTHONPATH=$PWD .venv/bin/python -m clipcache.flows.cli.flags      # rewrites flows/cli/eval_flags.json
                                                                       # and the docs' tables (cli/task_tables.py)

Choices drawn from a registry that other packages extend (``--task``, ``--model_type``) keep the built-in names
here and gain the installed plugins' names from their entry point group when the parser is built. The options of
tasks registered besides clipcache's own (plugins) are not stored: their flags are derived from the registry when
the parser is built (``add_plugin_option_flags``), only when the command line may use them.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

FLAGS_FILE = Path(__file__).with_name("eval_flags.json")
TYPES = {"int": int, "float": float}
# choices that other packages extend: the flag's destination -> (entry point group, names before the registry's)
PLUGIN_CHOICES = {"task": ("clipcache.tasks", ["auto"]), "model_type": ("clipcache.models", ["auto"])}
# The live registry of each extensible flag: names registered in this process (a test, a notebook, a plugin's own
# code) count when that registry is already imported; it is never imported for this.
LIVE_REGISTRIES = {"task": ("clipcache.tasks.evaluation", "TASKS"), "model_type": ("clipcache.tasks.models", "LOADERS")}


# Flags named differently from their parameter (clip_benchmark's names), and parameters the CLI sets otherwise.
FLAG_NAMES = {"datasets": "dataset"}
NOT_FLAGS = {"models", "verbose", "amp"}
FLAG_HELP = {
    "dataset": "shapes, shapes_retrieval, custom, imagefolder, image_labels, wds/<name>, a catalog name, or an "
               "installed plugin's reader (clipcache datasets)",
}


def _flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """Accept clip_benchmark's ``--recall_k`` and the dashed ``--recall-k`` alike."""
    names = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    parser.add_argument(*names, dest=name, **kwargs)


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(inner type, optional) of ``X | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _scalar(annotation: Any) -> dict[str, Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": list(typing.get_args(annotation))}
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return {"type": annotation} if annotation in (int, float) else {}


def add_param_flags(parser: argparse.ArgumentParser, model: Any, choices: dict[str, list[str]],
                    skip: Collection[str] = ()) -> None:
    """One flag per field of a pydantic parameter model (but those in ``skip``): lists take several values, Literals
    are choices, booleans are switches; help and defaults come from the field."""
    for name, info in model.model_fields.items():
        if name in NOT_FLAGS or name in skip:
            continue
        flag = FLAG_NAMES.get(name, name)
        annotation, _ = _unwrap(info.annotation)
        text = FLAG_HELP.get(flag, info.description)  # argparse formats help with %: a literal one is doubled
        kwargs: dict[str, Any] = {"help": text.replace("%", "%%") if text else text}
        if annotation is bool:
            kwargs.update(action="store_true", default=False)
        elif typing.get_origin(annotation) is list or (typing.get_origin(annotation) is tuple
                                                       and typing.get_args(annotation)[-1:] == (Ellipsis,)):
            kwargs.update(nargs="+", **_scalar(typing.get_args(annotation)[0]))
        else:
            kwargs.update(_scalar(annotation))
        if name in choices:
            kwargs["choices"] = choices[name]
        kwargs.setdefault("default", None)
        _flag(parser, flag, **kwargs)


def eval_flags(p: Any, builtin_only: bool = False) -> None:
    """Declare the eval / rescore flags on ``p`` (an argparse parser, or flows/cli/flags.py's recorder) from the
    live parameter models and registries; ``builtin_only``: registry choices without installed plugins' names."""
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.tasks.evaluation import BUILTIN_TASKS, TASKS
    from clipcache.tasks.models import LOADERS
    from clipcache.tasks.models.api_spec import ApiFields

    def names(registry: Any) -> list[str]:
        return [n for n in registry.names() if not builtin_only or registry.origin(n) == "clipcache"]

    models = p.add_argument_group("models (evaluated as the product of --model and --pretrained, as clip_benchmark)")
    _flag(models, "model", nargs="+", default=None, help="open_clip architecture, local-dir:PATH, hf-hub:ORG/REPO, "
                                                         "HF/ModelScope id, local directory, or tiny-shapes-clip")
    _flag(models, "pretrained", nargs="+", default=None, help="open_clip pretrained tags or checkpoint files")
    _flag(models, "pretrained_model", nargs="+", default=None,
          help="instead of the product: ARCH,PRETRAINED pairs, collections (openai, openclip_base, "
               "openclip_multilingual, openclip_all) or files with one ARCH,PRETRAINED per line")
    _flag(models, "model_type", default="auto", choices=["auto", *names(LOADERS)],
          help="which loader reads the model (auto: the first that recognises the name)")
    _flag(models, "arch_config", default=None, help="extra open_clip architecture JSON file or folder")
    _flag(models, "revision", default=None, help="hub revision (branch, tag or commit) of hub model ids")
    _flag(models, "trust_remote_code", action="store_true", default=False,
          help="run the Python code the models' own folders supply (local, or a hub repository's snapshot; "
               "--model_type internvl); recorded, with a hash of every code file, in each model's identity")
    add_param_flags(models, ApiFields, {})  # --api_base, --api_revision, ... of api: models (docs/api_models.md)
    tasks = [n for n in TASKS.names() if not builtin_only or n in BUILTIN_TASKS]  # not those registered in-process
    add_param_flags(p, EvaluateParams, {"task": ["auto", *tasks]})
    amp = p.add_mutually_exclusive_group()
    amp.add_argument("--amp", dest="amp", action="store_true", default=False,
                     help="mixed precision: bf16 on CPU, fp16 on CUDA")
    amp.add_argument("--no_amp", "--no-amp", dest="amp", action="store_false", help="fp32 (default; parity)")
    _flag(p, "quiet", action="store_true", default=False, help="no progress bars")
    _flag(p, "orchestrator", choices=["auto", "prefect", "local"], default="auto",
          help="prefect: every run a Prefect flow run; local: plain calls; auto (default): prefect when a Prefect "
               "server is configured (PREFECT_API_URL or `clipcache server start`), else local")
    if not builtin_only:
        add_plugin_option_flags(p)



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
    """The flags as ``eval_flags`` declares them from the live models (imports the parameter models)."""
    recorder = Recorder()
    eval_flags(recorder, builtin_only=True)
    return json.loads(json.dumps(recorder.calls))  # as read back from the file: tuples become lists


def stored_description() -> list[dict[str, Any]] | None:
    try:
        data = json.loads(FLAGS_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, list) else None


def add_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> None:
    """Declare the eval / rescore flags on ``parser`` from the stored description (the live models when it is
    missing or unreadable), and plugin tasks' options when ``argv`` may use them (``wants_plugin_flags``)."""
    calls = stored_description()
    if calls is None:
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
    if wants_plugin_flags(argv, {name for call in calls for name in call["names"]}):
        add_plugin_option_flags(parser)


def wants_plugin_flags(argv: Sequence[str] | None, stored: set[str]) -> bool:
    """Whether the arguments may use a plugin task's option: they ask for help or hold a flag the stored ones lack
    (None: unknown, so yes). Reading the installed packages' entry points costs more than the rest of the parser
    (importlib.metadata: about 0.1 s), so an ordinary command line never pays it."""
    if argv is None:
        return True
    return any(a in ("-h", "--help") or (a.startswith("--") and a.split("=", 1)[0] not in stored) for a in argv)


def add_plugin_option_flags(parser: Any) -> None:
    """The options of tasks registered besides clipcache's own (installed plugins, ``TASKS.register`` in this
    process) as flags, derived from their Options models like the built-in ones. Finding none costs one read of the
    entry points; the parameter models are imported only when there are some."""
    if not plugin_tasks_present():
        return
    from clipcache.flows.config.params import EvaluateParams

    model = EvaluateParams.for_registry()
    if model is not EvaluateParams:
        group = parser.add_argument_group("options of tasks from plugins")
        add_param_flags(group, model, {}, skip=EvaluateParams.model_fields)


def plugin_tasks_present() -> bool:
    from importlib.metadata import entry_points

    if entry_points(group=PLUGIN_CHOICES["task"][0]):
        return True
    module = sys.modules.get(LIVE_REGISTRIES["task"][0])  # registered in this process: the registry is imported
    return module is not None and bool(set(module.TASKS.in_order()) - set(module.BUILTIN_TASKS))


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
    """Rewrite flows/cli/eval_flags.json and, in a source checkout, the docs' tables derived from the task registry."""
    FLAGS_FILE.write_text(json.dumps(live_description(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {FLAGS_FILE}")
    from clipcache.flows.cli import task_tables

    return task_tables.main() if task_tables.DOCS.is_dir() else 0


if __name__ == "__main__":
    sys.exit(main())
