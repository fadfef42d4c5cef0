"""Process-wide settings applied before Prefect is imported: offline, quiet, project-local state."""

from __future__ import annotations

import logging
import os
from pathlib import Path


def configure(verbose: bool = False) -> None:
    """Idempotent. Uses ``setdefault`` so anything the user exported wins."""
    # Without these Prefect tries analytics hosts (unreachable here) and writes to ~/.prefect.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_HOME", str(Path.cwd() / ".prefect"))
    # Failed tasks would otherwise print full tracebacks for input errors we already report in one line.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "CRITICAL")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
    # The ephemeral API server needs 5-12 s to start here, far more on a loaded 2-core machine (default limit: 20 s).
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    logging.getLogger("clipcache").setLevel(logging.INFO if verbose else logging.WARNING)
