"""Process-wide settings, applied by entry points (``main()``, ``run_task``) before Prefect is imported: offline,
quiet, project-local state. Nothing here runs at import time."""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path
from typing import Any


def configure(verbose: bool = False) -> None:
    """Idempotent. Uses ``setdefault`` so anything the user exported wins."""
    # Without these Prefect tries analytics hosts (unreachable here) and writes to ~/.prefect.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_HOME", str(Path.cwd() / ".prefect"))
    # Failed tasks would otherwise print full tracebacks for input errors we already report in one line.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "CRITICAL")
    # clipcache's own log lines (stage start/end, counts, cache hits) go to the flow run's logs in Prefect.
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "clipcache")
    # The ephemeral API server needs 5-12 s to start here, far more on a loaded 2-core machine (default limit: 20 s).
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    logger = logging.getLogger("clipcache")
    logger.setLevel(logging.INFO)
    logger.propagate = False  # a library's basicConfig() on the root logger must not print our INFO lines
    if not any(getattr(h, "_clipcache", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setLevel(logging.INFO if verbose else logging.WARNING)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s", "%H:%M:%S"))
        handler._clipcache = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    else:
        for h in logger.handlers:
            if getattr(h, "_clipcache", False):
                h.setLevel(logging.INFO if verbose else logging.WARNING)


@cache
def error_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)
