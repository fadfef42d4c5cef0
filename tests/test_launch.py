"""How a CLI call runs: plain calls unless a Prefect server is there to see it (environment, the active Prefect
profile, or `clipcache server start`); names checked before anything heavy is imported; the background server's
whole life (start, a run that reports to it, stop) against a real `prefect server start`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clipcache.flows.orchestration import launch, prefect_server
from clipcache.storage.errors import ConfigError

from conftest import REPO
from prefect_db_helpers import keep_database, seed_database


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    (tmp_path / "prefect").mkdir()
    return tmp_path / "prefect"


def test_auto_runs_locally_when_no_server_is_configured(home):
    assert launch.configured_api() is None
    assert launch.choose("auto") == "local"
    assert launch.choose("prefect") == "prefect" and launch.choose("local") == "local"


def test_an_api_url_in_the_environment_means_a_flow_run(home, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert launch.choose("auto") == "prefect"


def test_the_active_prefect_profile_is_read_like_prefect_reads_it(home, monkeypatch):
    (home / "profiles.toml").write_text('active = "team"\n\n[profiles.default]\n\n'
                                        '[profiles.team]\nPREFECT_API_URL = "http://127.0.0.1:4300/api"\n')
    assert launch.configured_api() == "http://127.0.0.1:4300/api"
    assert launch.choose("auto") == "prefect"
    monkeypatch.setenv("PREFECT_PROFILE", "default")  # another profile chosen: no server
    assert launch.configured_api() is None
    (home / "profiles.toml").write_text("not toml [")
    monkeypatch.delenv("PREFECT_PROFILE")
    assert launch.configured_api() is None  # an unreadable file is no configuration, not a crash


def test_sharded_encoding_needs_prefect(home):
    assert launch.choose("auto", needs_prefect=True) == "prefect"
    with pytest.raises(ConfigError, match="task_runner"):
        launch.choose("local", needs_prefect=True)


def test_no_private_server_is_started_ahead_when_the_call_does_not_need_one(home, monkeypatch):
    def spawn(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(prefect_server, "_spawn", spawn)
    with launch.server_ahead("local") as server, launch.server_ahead("auto") as server_auto:
        assert server is None and server_auto is None  # local calls
    with pytest.raises(ConfigError, match="task_runner"):  # a config error found before: nothing started
        launch.server_ahead("local", needs_prefect=True)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")  # a configured server is used instead
    with launch.server_ahead("prefect") as server, launch.server_ahead("auto", needs_prefect=True) as sharded:
        assert server is None and sharded is None


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):
        pass


def test_a_running_background_server_is_found_and_a_dead_one_is_not(home):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api"
    (home / prefect_server.STATE_FILE).write_text(json.dumps({"url": url, "pid": os.getpid(), "log": ""}))
    try:
        assert launch.configured_api() == url and launch.choose("auto") == "prefect"
    finally:
        server.shutdown()
        server.server_close()
    assert launch.configured_api() is None  # its state file outlived it: not healthy, not used


def run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)


@pytest.mark.full  # subprocesses
@pytest.mark.parametrize("argv, expected", [
    (["eval", "--model", "tiny-shapes-clip", "--dataset", "shapse"], "Did you mean"),
    (["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--task", "retreival"], "is not one of"),
    (["rescore", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--ties", "random"], "is not one of topk, stable"),
    (["eval", "--model", "tiny-shapes-clip", "--dataset", "shapse", "--orchestrator", "prefect"], "Did you mean"),
])
def test_a_bad_name_fails_before_torch_or_prefect_is_imported(argv, expected, tmp_path):
    code = ("import sys\nfrom clipcache.flows.cli import main\ntry:\n    code = main(" + repr(argv) + ")\n"
            "except SystemExit as e:\n    code = e.code\n"
            "print(code, sorted(m for m in ('torch', 'open_clip', 'prefect', "
            "'clipcache.flows.orchestration.prefect_server') if m in sys.modules))")  # no server started either
    proc = run_python(code, {**os.environ, "PREFECT_HOME": str(tmp_path)})
    assert expected in proc.stderr, proc.stderr
    assert proc.stdout.split()[0] != "0" and proc.stdout.strip().endswith("[]"), proc.stdout


@pytest.mark.slow
def test_background_server_start_a_run_that_reports_to_it_and_stop(tmp_path, tmp_path_factory):
    exe = REPO / ".venv" / "bin" / "clipcache"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    # the server's database: the test run's migrated one where another server made it (tests/prefect_db_helpers.py)
    seeded = seed_database(tmp_path / "prefect", tmp_path_factory)
    started = subprocess.run([str(exe), "server", "start"], capture_output=True, text=True, env=env, timeout=300)
    assert started.returncode == 0, started.stderr
    if not seeded:
        keep_database(tmp_path / "prefect", tmp_path_factory)
    state = json.loads((tmp_path / "prefect" / prefect_server.STATE_FILE).read_text())
    try:
        run = subprocess.run([str(exe), "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "30",
                              "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"),
                              "--quiet"], capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr
        request = urllib.request.Request(f"{state['url']}/flow_runs/filter", data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            flow_runs = json.loads(response.read())
        assert [r["state_type"] for r in flow_runs] == ["COMPLETED"]  # the CLI's run is a flow run on that server
    finally:
        stopped = subprocess.run([str(exe), "server", "stop"], capture_output=True, text=True, env=env, timeout=60)
    assert stopped.returncode == 0 and str(state["pid"]) in stopped.stdout
    assert not prefect_server.process_alive(state["pid"])
    status = subprocess.run([str(exe), "server", "status"], capture_output=True, text=True, env=env, timeout=60)
    assert status.returncode == 3 and "not running" in status.stdout
