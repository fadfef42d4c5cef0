"""``clipcache init [DIR]``: the deployments' project folder on a machine that has only the installed package.

It writes the shipped ``prefect.yaml`` (the deployments, with module entrypoints such as
``clipcache.flows.orchestration.flows:evaluate_suite``) and ``suites/nightly.yaml`` (the nightly suite) into DIR; ``prefect
deploy --all`` / ``clipcache serve`` are then run there, and runs use DIR as their working directory (the suite file,
``cache`` and ``outputs`` are relative to it). An existing file is never replaced.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from clipcache.flows.cli.commands import add_command

PROJECT = Path(__file__).resolve().parent.parent / "project"
FILES = ("prefect.yaml", "suites/nightly.yaml")


def add_init_parser(sub: argparse._SubParsersAction) -> None:
    init = add_command(sub, "init",
                       description="Write the deployments (prefect.yaml) and the nightly suite "
                                   "(suites/nightly.yaml) into FOLDER, for `prefect deploy --all` or "
                                   "`clipcache serve` run there. An existing file is never replaced: "
                                   "init then writes nothing and names it.")
    init.add_argument("folder", nargs="?", default=".", help="default: the current folder")
    init.set_defaults(handler=run_init_command)


def init_project(folder: str | Path) -> list[Path]:
    """Copy the shipped project files into ``folder``; refuses (ConfigError) if any of them already exists."""
    from clipcache.storage.errors import ConfigError

    folder = Path(folder)
    targets = [folder / name for name in FILES]
    existing = [str(t) for t in targets if t.exists() or t.is_symlink()]
    if existing:
        raise ConfigError(f"{existing[0]} already exists: clipcache init never replaces a file (move it away, or "
                          f"choose another folder)")
    for name, target in zip(FILES, targets, strict=True):
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        partial.write_bytes((PROJECT / name).read_bytes())
        os.replace(partial, target)
    return targets


def run_init_command(args: argparse.Namespace) -> int:
    written = init_project(args.folder)
    print("wrote " + ", ".join(str(p) for p in written))
    print(f"next, in {args.folder}: prefect work-pool create clipcache --type process; prefect --no-prompt deploy "
          f"--all; prefect worker start --pool clipcache (or: clipcache serve); see the README's deployment steps")
    return 0
