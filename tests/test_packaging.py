"""One import root: the installed distribution exposes ``clipcache`` only; the repository's flows/, tasks/ and
storage/ folders install as ``clipcache.flows`` / ``clipcache.tasks`` / ``clipcache.storage``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import REPO


def test_generic_top_level_names_are_not_importable_from_elsewhere(tmp_path):
    probe = ("import importlib.util as u, clipcache.flows, clipcache.tasks.datasets, clipcache.storage.results; "
             "print([n for n in ('flows', 'tasks', 'storage') if u.find_spec(n) is not None])")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_source_package_is_packaged():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    found = set()
    for top, package in config["package-dir"].items():
        for init in Path(REPO, package).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / package)
            found.add(".".join([top, *rel.parts]))
    assert found == declared
