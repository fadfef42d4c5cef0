"""The package version, and the source commit it was built from.

``VERSION`` is the one place the release number is written (pyproject.toml reads it). The commit comes from
``_build.json``, which the build (setup.py) writes into the wheel and the sdist, or, in a git checkout, from git;
an installed copy never runs git. Nothing here runs at import time.
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path

VERSION = "0.1.0"
BUILD_INFO = "_build.json"
HERE = Path(__file__).resolve().parent


def _checkout_commit() -> str | None:
    """HEAD of the git checkout this package is imported from (not of whatever folder the user is in)."""
    root = HERE.parent
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


@cache
def commit() -> str | None:
    """The source commit (12 hex digits), or None when neither the build nor a checkout says."""
    try:
        saved = json.loads((HERE / BUILD_INFO).read_text(encoding="utf-8")).get("commit")
    except (OSError, ValueError, AttributeError):
        saved = None
    if isinstance(saved, str) and saved:
        return saved
    return _checkout_commit()


def full_version() -> str:
    """``0.1.0``, or ``0.1.0+g<commit>`` (a PEP 440 local version) when the source commit is known; this is what
    every run row's ``clipcache_version`` holds."""
    found = commit()
    return f"{VERSION}+g{found}" if found else VERSION


def describe() -> str:
    """``clipcache --version``: ``clipcache 0.1.0 (commit 8b5c68e2c13e) from /path/to/clipcache``."""
    found = commit()
    return f"clipcache {VERSION}" + (f" (commit {found})" if found else "") + f" from {HERE}"
