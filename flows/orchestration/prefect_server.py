"""A local Prefect server for the CLI: started once in the background and reused by later calls, or private to one
call and gone with it.

- ``clipcache server start`` runs ``prefect server start`` on 127.0.0.1 detached from the terminal and records its
  URL and pid in ``$PREFECT_HOME/clipcache-server.json``; later CLI calls find it there (when PREFECT_API_URL is not
  set) and run their evaluations as Prefect flow runs against it, visible in its UI. ``clipcache server stop`` ends it.
- ``--orchestrator prefect`` with no server configured starts a private one for the call, in place of Prefect's own
  temporary server: it is killed when the call ends, and the kernel kills it if the call is killed (SIGKILL
  included), so nothing the CLI starts outlives it. The CLI spawns it as soon as its flags are validated
  (flows/orchestration/launch.py ``server_ahead``), so the server's start-up overlaps the import of torch and the
  pipeline; the call waits for it only where the flow run begins.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from clipcache.storage.atomic import process_alive
from clipcache.storage.errors import ConfigError

STATE_FILE = "clipcache-server.json"
START_TIMEOUT = 180.0  # a fresh SQLite database and migrations: ~7 s here, far more on a loaded 2-core machine


@dataclass(frozen=True)
class ServerInfo:
    url: str  # the API URL (…/api)
    pid: int
    log: str


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.cwd() / ".prefect")


def _state_path() -> Path:
    return prefect_home() / STATE_FILE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(api_url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGKILL when the process that started it ends (Linux)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _spawn(port: int, log: Path, private: bool) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           "PREFECT_HOME": str(prefect_home()), "PREFECT_UI_ENABLED": os.environ.get("PREFECT_UI_ENABLED", "true")}
    env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "ab") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=not private,
                                preexec_fn=_die_with_parent if private and sys.platform == "linux" else None)


def _wait_healthy(process: subprocess.Popen, api_url: str, log: Path) -> None:
    from clipcache.tasks.progress import StageProgress

    with StageProgress().status(f"starting a Prefect server on {api_url.removesuffix('/api')} (log: {log})"):
        _poll_healthy(process, api_url, log)


def _poll_healthy(process: subprocess.Popen, api_url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise ConfigError(f"the Prefect server exited while starting (see {log}){': ' + tail[0] if tail else ''}")
        if healthy(api_url):
            return
        time.sleep(0.25)
    process.kill()
    raise ConfigError(f"the Prefect server did not start within {START_TIMEOUT:.0f} s (see {log})")


def running() -> ServerInfo | None:
    """The background server `clipcache server start` left, if it is still up."""
    try:
        state = json.loads(_state_path().read_text())
        info = ServerInfo(state["url"], int(state["pid"]), state.get("log", ""))
    except (OSError, ValueError, KeyError):
        return None
    return info if process_alive(info.pid) and healthy(info.url, timeout=0.5) else None


def start(port: int | None = None) -> ServerInfo:
    if (info := running()) is not None:
        return info
    port = port or _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = prefect_home() / "clipcache-server.log"
    process = _spawn(port, log, private=False)
    _wait_healthy(process, api_url, log)
    info = ServerInfo(api_url, process.pid, str(log))
    _state_path().write_text(json.dumps({"url": info.url, "pid": info.pid, "log": info.log}))
    return info


def stop() -> ServerInfo | None:
    info = running()
    _state_path().unlink(missing_ok=True)
    if info is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(info.pid, signal.SIGTERM)
    for _ in range(100):
        if not process_alive(info.pid):
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(info.pid, signal.SIGKILL)
    return info


def _drain_prefect_clients(timeout: float = 15.0) -> None:
    """Deliver the run logs and events Prefect still queues for this server before it stops. Otherwise its workers
    try again at interpreter exit against a server that is gone: "Error logging to API" on stderr, and a process that
    can wait there for minutes before it exits."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            service.drain_all(timeout=timeout)


class PrivateServer:
    """A server for this process only, started ahead of need: the process is spawned at construction (its start-up
    overlaps whatever the caller does next: the CLI imports torch), ``ready()`` waits for it where it is needed,
    ``close()`` stops it (idempotent). The kernel kills it if we die."""

    def __init__(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}/api"
        self.log = prefect_home() / f"clipcache-private-{os.getpid()}.log"
        for stale in self.log.parent.glob("clipcache-private-*.log"):  # left by CLIs that were killed
            pid = stale.stem.rsplit("-", 1)[-1]
            if pid.isdigit() and not process_alive(int(pid)):
                stale.unlink(missing_ok=True)
        self.process = _spawn(port, self.log, private=True)
        self._ready = False

    def ready(self) -> str:
        """Its API URL, once it answers."""
        if not self._ready:
            _wait_healthy(self.process, self.url, self.log)
            self._ready = True
        return self.url

    def close(self) -> None:
        if self.process.poll() is None:
            _drain_prefect_clients()
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.unlink(missing_ok=True)

    def __enter__(self) -> PrivateServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def private_server(started: PrivateServer | None = None) -> Iterator[str]:
    """A server for this process only (``started``: one spawned earlier): yields its API URL once it answers; stopped
    on exit, killed by the kernel if we die."""
    server = started or PrivateServer()
    try:
        yield server.ready()
    finally:
        server.close()
