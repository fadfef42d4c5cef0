"""Build hooks only; the project is declared in pyproject.toml.

The wheel and the sdist carry ``clipcache/_build.json`` with the git commit they were built from, so an installed
copy can say which source it is (``clipcache --version``, every run row) without a checkout. Built from an unpacked
sdist (no git), the sdist's own file is carried over.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

BUILD_INFO = Path("clipcache", "_build.json")


def _build_info() -> str:
    commit = None
    try:
        done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=30,
                              check=False)
        commit = done.stdout.strip() if done.returncode == 0 and Path(".git").exists() else None
    except OSError:
        pass
    if not commit and BUILD_INFO.is_file():  # an unpacked sdist: the commit its build recorded
        commit = json.loads(BUILD_INFO.read_text(encoding="utf-8")).get("commit")
    return json.dumps({"commit": commit or None}) + "\n"


class BuildPy(build_py):
    def run(self) -> None:
        if not self.editable_mode:  # a file deleted from the source must not ship from an earlier build's build/lib
            shutil.rmtree(Path(self.build_lib, "clipcache"), ignore_errors=True)
        super().run()
        target = Path(self.build_lib, BUILD_INFO)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_build_info(), encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, BUILD_INFO))]


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        target = Path(base_dir, BUILD_INFO)
        target.unlink(missing_ok=True)  # a hard link to the source tree's copy, if one was there
        target.write_text(_build_info(), encoding="utf-8")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
