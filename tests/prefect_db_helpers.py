"""A migrated Prefect database, shared by the real `prefect server start` processes of one test run.

A server on a fresh SQLite database spends about half of its start-up CPU on Alembic migrations. The first server of a
run (tests/test_deployments.py's `prefect_api`, the background server of tests/test_launch.py) migrates a fresh
database for real and, once healthy, leaves a copy of it (SQLite's backup API: a consistent snapshot of a live
database); the servers started after it begin from that copy, where Prefect's start-up migration finds nothing to do.
The copy lives in the run's temporary root, which pytest-xdist workers share, and appears by atomic rename: a server
that starts before it exists migrates its own database, as the first one did."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import prefect


def _template(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's root, shared by its workers
    return root / f"prefect-{prefect.__version__}-migrated.db"


def seed_database(home: Path, tmp_path_factory) -> bool:
    """Put the run's migrated database at `home`/prefect.db (Prefect's default location); False when there is none
    yet (the server then migrates a fresh one)."""
    template = _template(tmp_path_factory)
    if not template.is_file():
        return False
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, home / "prefect.db")
    return True


def keep_database(home: Path, tmp_path_factory) -> None:
    """After a server on `home` is healthy: keep a copy of its database for later servers, unless one exists."""
    template = _template(tmp_path_factory)
    if template.is_file() or not (home / "prefect.db").is_file():
        return
    partial = template.with_name(f"{template.name}.{os.getpid()}.partial")
    source, copy = sqlite3.connect(home / "prefect.db"), sqlite3.connect(partial)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()
    os.replace(partial, template)
