"""``clipcache`` command line. Flags follow LAION clip_benchmark (``--dataset a b c``, ``--recall_k 1 5 10``), which
is why this is argparse: click/typer options cannot take several values after one flag.

The eval / rescore flags are generated from the flow's parameter model (flows/config/params.py), so the CLI, evalscope
configs and deployments cannot drift apart. Start-up stays light: nothing imports torch, open_clip or Prefect before
the names given have been checked.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from clipcache.flows.cli.commands import add_command, add_commands
from clipcache.flows.cli.flags import FLAG_NAMES, NOT_FLAGS, _flag

# eval / rescore: the description beside COMMANDS' help line (flows/cli/commands.py)
EVAL_DESCRIPTIONS = {
    "eval": "Evaluate CLIP-style models; flags as in LAION clip_benchmark.",
    "rescore": "Recompute metrics from the cache: no image is decoded and the model is loaded only to encode class "
               "prompts it has never seen.",
}


def add_eval_parser(sub: argparse._SubParsersAction, command: str, argv: Sequence[str] | None = None) -> None:
    """The eval / rescore parser. Its flags come from their stored description (flows/cli/flags.py), so neither
    --help nor a name error imports the parameter models; plugin tasks' options are looked up only when ``argv``
    asks for help or holds a flag the stored ones lack (None: always)."""
    p = add_command(sub, command, description=EVAL_DESCRIPTIONS[command])
    from clipcache.flows.cli.flags import add_flags

    add_flags(p, argv)
    p.set_defaults(handler=_cmd_eval, cached_only=command == "rescore")


def add_run_parser(sub: argparse._SubParsersAction, command: str, argv: Sequence[str] | None = None) -> None:
    run = add_command(sub, command)
    run.add_argument("config", help="task_cfg.json or task_cfg.yaml")
    run.set_defaults(handler=_cmd_run)


def add_serve_parser(sub: argparse._SubParsersAction, command: str, argv: Sequence[str] | None = None) -> None:
    serve = add_command(sub, command, description="Register every deployment in prefect.yaml with the Prefect API "
                                                  "and run their scheduled and triggered flow runs here, until "
                                                  "interrupted.")
    _flag(serve, "prefect_file", default="prefect.yaml")
    _flag(serve, "deployment", nargs="+", default=None, help="serve only these deployments")
    _flag(serve, "limit", type=int, default=None, help="at most this many concurrent flow runs")
    serve.set_defaults(handler=_cmd_serve)


def models_from_args(args: argparse.Namespace) -> list[dict[str, Any]]:
    """clip_benchmark's rule: ``--pretrained_model`` (pairs, collections, files), else the product of ``--model`` and
    ``--pretrained``."""
    from clipcache.storage.errors import ConfigError

    if args.pretrained_model:
        if args.model or args.pretrained:
            raise ConfigError("--pretrained_model: give either it or --model/--pretrained, not both")
        from clipcache.tasks.models.collections import expand_pretrained_models

        pairs = expand_pretrained_models(args.pretrained_model)
    else:
        if not args.model:
            raise ConfigError("--model is required (or --pretrained_model ARCH,PRETRAINED)")
        pairs = [(m, p) for m in args.model for p in (args.pretrained or [None])]
    from clipcache.tasks.models.api_spec import ApiFields, api_fields_for

    api = api_fields_for([m for m, _ in pairs], args.model_type, {f: getattr(args, f) for f in ApiFields.model_fields})
    return [{"model_name": m, "pretrained": p, "model_type": args.model_type, "arch_config": args.arch_config,
             "revision": args.revision, "hub": args.hub or "huggingface",
             **({"trust_remote_code": True} if args.trust_remote_code else {}), **extra}
            for (m, p), extra in zip(pairs, api, strict=True)]


def params_from_args(args: argparse.Namespace) -> Any:
    from clipcache.flows.config.params import EvaluateParams, validate

    model = EvaluateParams.for_registry()  # with the options of plugin tasks, which add_plugin_option_flags added
    given = {name: getattr(args, FLAG_NAMES.get(name, name), None) for name in model.model_fields
             if name not in NOT_FLAGS}
    return validate(model, {
        **{k: v for k, v in given.items() if v is not None and v is not False},
        "models": models_from_args(args), "amp": args.amp, "verbose": not args.quiet,
    })


def _cmd_eval(args: argparse.Namespace) -> int:
    params = params_from_args(args)
    if params.suite:
        from clipcache.tasks.suites import load_suite

        skipped = [e.dataset for e in load_suite(params.suite).datasets if not e.runnable]
        if skipped:
            out().print(f"suite {params.suite}: not evaluated (no reader in clipcache yet): {', '.join(skipped)}; "
                        f"its suite score stays partial without them", highlight=False)
    from clipcache.flows.orchestration import launch
    from clipcache.tasks.progress import StageProgress

    # a private Prefect server this call needs starts now: its start-up overlaps the imports below
    with launch.server_ahead(args.orchestrator, launch.needs_prefect(params, args.cached_only)) as server:
        with StageProgress(enabled=params.verbose).status("starting: loading torch and the pipeline"):
            from clipcache.flows.orchestration.pipeline import run_evaluation  # noqa: F401  (the slow imports)
            from clipcache.tasks.encode import stage  # noqa: F401
            if server is not None:  # Prefect too, while its server starts (it reads PREFECT_API_URL on import)
                from clipcache.flows.orchestration import flows  # noqa: F401
        results = launch.evaluate(params, args.cached_only, args.orchestrator, server=server)
    return _show(results, params)


def _cmd_run(args: argparse.Namespace) -> int:
    from clipcache.flows.config.convert_params import ConvertParams
    from clipcache.flows.config.evalscope import parse_task_config

    incomplete = 0
    for params in parse_task_config(args.config):  # validated all before the first runs
        if isinstance(params, ConvertParams):
            from clipcache.flows.orchestration.launch import convert

            for result in convert(params):
                m = result.get("metrics", {})
                incomplete += bool(m.get("n_failed"))
                out().print(f"{result['model']} / {result['dataset']}: " + (
                    "skipped (result exists)" if result.get("status") == "skipped" else
                    f"{m['n_captioned']}/{m['n_images']} images captioned ({m['api_calls']} API calls, "
                    f"{m['from_cache']} from cache, {m['n_failed']} failed) -> {m['save_path']}"), highlight=False)
            continue
        from clipcache.flows.orchestration.launch import evaluate

        _show(evaluate(params, False, "auto"), params)
    if incomplete:  # a conversion that did not finish its job is not a success, even with partial files written
        print(f"error: {incomplete} conversion(s) incomplete: images failed (listed in the *.incomplete.json "
              f"report); the results were left as they were. Run `clipcache run {args.config}` again to caption only "
              f"the failed images (the others come from the caption cache)", file=sys.stderr)
        return 1
    return 0


def _show(results: list, params: Any) -> int:
    from clipcache.flows.cli.console import print_results

    print_results(out(), results, params.output_dir)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from clipcache.flows.orchestration.deployments import serve_deployments

    serve_deployments(args.prefect_file, args.deployment, args.limit)
    return 0


def out() -> Any:
    from clipcache.flows.cli.console import data_console

    return data_console(160)  # names in results are data: printed as they are, never as markup


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with the closest choice for a mistyped one), not the whole usage."""

    def error(self, message: str) -> NoReturn:
        import difflib
        import re

        if m := re.match(r"argument (?P<flag>\S+): invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)$",
                         message):
            choices = re.findall(r"'([^']*)'", m["choices"])
            close = difflib.get_close_matches(m["given"], choices, n=1, cutoff=0.6)
            message = (f"{m['flag']}: {m['given']!r} is not one of {', '.join(choices)}" +
                       (f". Did you mean {close[0]}?" if close else ""))
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


class VersionAction(argparse.Action):
    """``--version``: the release and the source commit, worked out only when asked (no git call otherwise)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version (and source commit) and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> NoReturn:
        from clipcache._version import describe

        print(describe())
        parser.exit(0)


def build_parser(command: str | None = None, argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. Only ``command``'s parser is built (start-up time); every other command is named with its
    help line (flows/cli/commands.py), which is all ``clipcache --help`` and a mistyped command need. ``argv``: the
    arguments it will parse, when known (plugin tasks' option flags are derived only when they may be used)."""
    parser = OneLineParser(prog="clipcache", allow_abbrev=False,
                           description="Evaluate CLIP-style models from an embedding cache.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Prefect and library logs")
    parser.add_argument("--version", action=VersionAction)
    add_commands(parser.add_subparsers(dest="command", required=True), command, argv)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from clipcache.flows.orchestration import runtime
    from clipcache.storage.errors import ClipcacheError

    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args: argparse.Namespace | None = None
    try:
        args = build_parser(command, argv).parse_args(argv)
        runtime.configure(verbose=args.verbose)
        return int(args.handler(args))
    except ClipcacheError as e:
        runtime.error_console().print(f"[bold red]error:[/] {_escape(str(e))}", highlight=False, soft_wrap=True)
        return e.exit_code
    except BrokenPipeError:  # `clipcache compare --format json | head`: the reader has all it wanted
        _silence_stdout()
        return 1  # as rich's console ends a table print that meets a closed pipe: every command alike
    except Exception as e:  # an OSError of the disk, or any error that is an object store's answer after retries
        line = (_storage_problem(e) if isinstance(e, OSError) else None) or _store_problem(e, args)
        if line is None:
            raise  # anything else is a bug: keep its traceback
        runtime.error_console().print(f"[bold red]error:[/] {_escape(line)}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        runtime.error_console().print("[yellow]interrupted[/]: finished work is cached; run the same command again "
                                      "to continue")
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what the closed pipe refused raises nothing."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _storage_problem(error: OSError) -> str | None:
    """One line for what the disk, not the code, refuses: full, over quota, a file-size limit, read-only, denied.
    Writes are atomic or resumable, so what finished is kept and the same command continues after the fix."""
    import errno

    where = f" writing {error.filename}" if error.filename else ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        what = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                errno.EFBIG: "file size limit exceeded"}[error.errno]
        return (f"{what}{where}: free some space (e.g. `clipcache cache gc --max_size ...`) or point --cache_dir / "
                f"--output_dir elsewhere; finished work is kept, so the same command continues")
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        what = "read-only file system" if error.errno == errno.EROFS else "permission denied"
        return f"{what}{where}: choose a writable --cache_dir / --output_dir"
    return None


def _store_problem(error: Exception, args: argparse.Namespace | None) -> str | None:
    """flows/cli/store_errors.py's line, naming the remote folders the command was given (--cache_dir ...)."""
    from clipcache.flows.cli.store_errors import store_problem

    where = [str(v) for k, v in sorted(vars(args or argparse.Namespace()).items())
             if k.endswith("_dir") and isinstance(v, str) and "://" in v]
    return store_problem(error, where)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


if __name__ == "__main__":
    sys.exit(main())
