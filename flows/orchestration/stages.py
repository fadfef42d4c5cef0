"""How a flow's stages run: as Prefect task runs (under a flow run, visible in the UI) or as plain calls.

The evaluation pipeline (flows/orchestration/pipeline.py) is written once against :class:`Stages`. The Prefect flows hand it
:class:`PrefectStages`, so every stage is a task run named with its model and dataset; a CLI call with no Prefect
server configured hands it :class:`LocalStages`, which runs the same stages in the same order as plain calls with the
same log lines, and costs no orchestrator start-up (flows/orchestration/launch.py decides).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar

log = logging.getLogger("clipcache.flow")
P = ParamSpec("P")
R = TypeVar("R")


class Stages(Protocol):
    """``run(name, run_name, fn, *args, **kwargs)`` is ``fn(*args, **kwargs)`` as a stage: the arguments are checked
    against ``fn``'s signature and the result has its type."""

    kind: str

    def run(self, name: str, run_name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...


class LocalStages:
    kind = "local"

    def run(self, name: str, run_name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        return _run_logged(run_name, fn, *args, **kwargs)


def _run_logged(run_name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)`` between a start and an end line, the same under both kinds of stages."""
    started = time.perf_counter()
    log.info("%s: started", run_name)
    result = fn(*args, **kwargs)
    log.info("%s: done in %.2f s", run_name, time.perf_counter() - started)
    return result


class PrefectStages:
    """Each stage a Prefect task run. Our own cache decides what is recomputed, so Prefect's input caching is off
    (hashing a model session or a dataset index would cost time and mean nothing); retries stay off (nothing here is
    transient: bad files stay bad)."""

    kind = "prefect"

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, Callable[..., Any]], Any] = {}
        ship_logs_to_prefect()

    def run(self, name: str, run_name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        key = (name, fn)
        if key not in self._tasks:
            make_task: Any = task  # its overloads do not type a cache policy given by keyword
            self._tasks[key] = make_task(_logged(fn), name=name, cache_policy=NO_CACHE)
        result: R = self._tasks[key].with_options(task_run_name=run_name)(*args, **kwargs)
        return result


def _logged(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with a start and an end line in the task run's log (as LocalStages writes them)."""
    import functools

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        from prefect.runtime import task_run

        return _run_logged(task_run.name or fn.__name__, fn, *args, **kwargs)  # named: stage, model, dataset

    return run


def ship_logs_to_prefect() -> None:
    """clipcache's log lines (stage start and end, counts, cache hits, retries) into the Prefect run they belong to,
    in any process a flow runs in: a worker or `serve` never reads the CLI's PREFECT_LOGGING_EXTRA_LOGGERS."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("clipcache")
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    if not any(isinstance(h, APILogHandler) for h in logger.handlers):
        logger.addHandler(APILogHandler())
