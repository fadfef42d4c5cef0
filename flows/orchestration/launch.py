"""How a CLI or Python call runs a flow: as a Prefect flow run when a Prefect server is there to see it, else as
plain calls with no orchestrator start-up.

- ``auto`` (default): Prefect when ``PREFECT_API_URL`` is set (in the environment or the active Prefect profile) or
  a background server from ``clipcache server start`` is up (its URL is then used); otherwise the local path, which runs the same stages in the same order
  (flows/orchestration/stages.py) and writes the same files and rows, in a fraction of the time (Prefect's temporary server alone
  costs 5-15 s per call). ``--task_runner`` other than ``none`` needs Prefect's task runners, so it implies Prefect.
- ``prefect``: always a flow run; with no server configured, a private server is started for the call and stopped
  with it (flows/orchestration/prefect_server.py), so no process outlives the CLI. The CLI starts it ahead
  (``server_ahead``, once its flags are valid and before torch is imported) and waits for it where the flow begins.
- ``local``: always plain calls.

Deployments and workers run the Prefect flows directly and are unaffected.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from clipcache.flows.config.params import EvaluateParams

if TYPE_CHECKING:
    from clipcache.flows.orchestration.prefect_server import PrivateServer


def profile_api(home: str | os.PathLike | None = None) -> str | None:
    """PREFECT_API_URL of the active Prefect profile (what `prefect config set PREFECT_API_URL=...` writes), read
    from ``$PREFECT_HOME/profiles.toml`` without importing Prefect: PREFECT_PROFILE names the profile, else the
    file's ``active`` key."""
    import tomllib
    from pathlib import Path

    from clipcache.flows.orchestration.prefect_server import prefect_home

    path = Path(home or prefect_home()) / "profiles.toml"
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = os.environ.get("PREFECT_PROFILE") or document.get("active")
    settings = (document.get("profiles") or {}).get(name) if isinstance(name, str) else None
    url = settings.get("PREFECT_API_URL") if isinstance(settings, dict) else None
    return url if isinstance(url, str) and url else None


def configured_api() -> str | None:
    """The Prefect API this process should report to, if any: PREFECT_API_URL, else the active Prefect profile's,
    else a running background server from `clipcache server start`."""
    if url := os.environ.get("PREFECT_API_URL") or profile_api():
        return url
    from clipcache.flows.orchestration.prefect_server import running

    info = running()
    return info.url if info else None


def choose(requested: str, needs_prefect: bool = False) -> str:
    if requested == "local" and needs_prefect:
        from clipcache.storage.errors import ConfigError

        raise ConfigError("task_runner: sharded encoding runs on Prefect's task runners; use --orchestrator auto or "
                          "prefect with it")
    if requested != "auto":
        return requested
    return "prefect" if needs_prefect or configured_api() else "local"


def needs_prefect(params: EvaluateParams, cached_only: bool) -> bool:
    """Sharded encoding runs on Prefect's task runners."""
    return params.task_runner != "none" and not cached_only


def server_ahead(requested: str, needs_prefect: bool = False) -> contextlib.AbstractContextManager[
        PrivateServer | None]:
    """The private server this call will need, its process spawned now (so its start-up overlaps what the caller
    does next, Prefect's import included: PREFECT_API_URL is its URL inside the block) and stopped when the block
    ends: None (nothing started) when the call runs locally or a server is configured. A ConfigError of ``choose``
    is raised before anything starts."""
    if choose(requested, needs_prefect) != "prefect" or configured_api():
        return contextlib.nullcontext()
    return _started_ahead()


@contextlib.contextmanager
def _started_ahead() -> Iterator[PrivateServer]:
    from clipcache.flows.orchestration.prefect_server import PrivateServer

    with PrivateServer() as server:
        os.environ["PREFECT_API_URL"] = server.url  # known before it answers: Prefect may be imported meanwhile
        try:
            yield server
        finally:
            os.environ.pop("PREFECT_API_URL", None)


@contextlib.contextmanager
def prefect_api(started: PrivateServer | None = None) -> Iterator[None]:
    """Make sure Prefect has an API to talk to: ``started`` (a private server spawned ahead by ``server_ahead``),
    else the configured one, else a private server for this call."""
    url = None if started else configured_api()
    if url:
        os.environ["PREFECT_API_URL"] = url
        yield
        return
    from clipcache.flows.orchestration.prefect_server import private_server

    with private_server(started) as url:
        os.environ["PREFECT_API_URL"] = url
        try:
            yield
        finally:
            os.environ.pop("PREFECT_API_URL", None)


def evaluate(params: EvaluateParams, cached_only: bool, orchestrator: str = "auto", *,
             server: PrivateServer | None = None) -> list[Any]:
    """``server``: the private server ``server_ahead`` started for this call, if any."""
    mode = choose(orchestrator, needs_prefect(params, cached_only))
    if mode == "prefect":
        with prefect_api(server):
            from clipcache.flows.orchestration.deployments import with_registry_options
            from clipcache.flows.orchestration.flows import evaluate as evaluate_flow
            from clipcache.flows.orchestration.flows import rescore as rescore_flow

            # tasks registered in this process since flows.py was loaded: their options are parameters too
            return with_registry_options(rescore_flow if cached_only else evaluate_flow)(params)
    from clipcache.flows.orchestration.pipeline import run_evaluation
    from clipcache.flows.orchestration.stages import LocalStages

    return run_evaluation(params, LocalStages(), cached_only).results


def convert(params: Any, orchestrator: str = "auto") -> list[dict]:
    if choose(orchestrator) == "prefect":
        with prefect_api():
            from clipcache.flows.orchestration.flows import convert as convert_flow

            return convert_flow(params)
    from clipcache.flows.orchestration.conversion import run_conversion
    from clipcache.flows.orchestration.stages import LocalStages

    return run_conversion(params, LocalStages())


def report(params: Any, orchestrator: str = "auto") -> str:
    if choose(orchestrator) == "prefect":
        with prefect_api():
            from clipcache.flows.orchestration.flows import report as report_flow

            return str(report_flow(params))
    from clipcache.flows.orchestration.reporting import run_report
    from clipcache.flows.orchestration.stages import LocalStages

    return run_report(params, LocalStages())
