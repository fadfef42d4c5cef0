"""Fault injection around the CLI's private Prefect server (marked ``faults``; runs in CI with the full suite): a
CLI killed by SIGKILL, SIGTERM or Ctrl-C leaves no process it started behind, and a CLI with a private server exits
cleanly. The console script itself runs here (not tests/cli_zygote.py's fork): what is checked is the process tree.
Each private server starts from the test run's migrated database where there is one (tests/prefect_db_helpers.py):
what these tests prove does not depend on Alembic migrating a fresh one, and the CLI's imports get the cores."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_db_helpers import seed_database
from test_faults import CLI, env

pytestmark = [pytest.mark.faults, pytest.mark.full]


def run_console_script(argv: list[str], work: Path, **extra: str) -> subprocess.CompletedProcess:
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(CLI), *argv], cwd=work, env=env(PREFECT_HOME=str(work / "prefect"), **extra),
                          capture_output=True, text=True, timeout=300)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = set(), [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc (Linux)")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "Ctrl-C"])
def test_a_killed_cli_leaves_no_prefect_server_behind(tmp_path, tmp_path_factory, how):
    seed_database(tmp_path / "prefect", tmp_path_factory)
    argv = ["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--orchestrator", "prefect", "--quiet",
            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    proc = subprocess.Popen([str(CLI), *argv], cwd=tmp_path, env=env(PREFECT_HOME=str(tmp_path / "prefect")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, tree = time.monotonic() + 180, set()
    while time.monotonic() < deadline and proc.poll() is None:
        tree = _descendants(proc.pid)
        if any(b"server" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in tree
               if Path(f"/proc/{pid}/cmdline").exists()):
            break
        time.sleep(0.2)
    assert tree and proc.poll() is None, "the CLI did not start its private Prefect server"
    time.sleep(3)  # let the server get going (and spawn whatever it spawns)
    tree = _descendants(proc.pid)
    proc.send_signal(how)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in tree):
        time.sleep(0.2)
    survivors = [pid for pid in tree if Path(f"/proc/{pid}").exists()
                 and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert survivors == [], f"processes the killed CLI started are still running: {survivors}"


def test_a_cli_with_a_private_server_exits_cleanly(tmp_path, tmp_path_factory):
    seed_database(tmp_path / "prefect", tmp_path_factory)  # never kept from here: this database gets a flow run
    done = run_console_script(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "40", "--orchestrator",
                "prefect", "--quiet", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")],
               tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Error logging to API" not in done.stderr and "Traceback" not in done.stderr


SPY = """import subprocess, sys
from clipcache.storage.errors import ConfigError
spawned = []
class Spy(subprocess.Popen):
    def __init__(self, args, *rest, **kw):
        super().__init__(args, *rest, **kw)
        spawned.append((self, "torch" in sys.modules))
class ConfigErrorAfterTheSpawn:  # the first import after the spawn finds a bad config (a fault injected there)
    def find_spec(self, name, *args):
        if name == "clipcache.flows.orchestration.pipeline" and spawned:
            raise ConfigError("dataset_root: an error found after the server was spawned")
subprocess.Popen = Spy
sys.meta_path.insert(0, ConfigErrorAfterTheSpawn())
from clipcache.flows.cli import main
code = main(sys.argv[1:])
print(code, [(torch, p.poll() is not None) for p, torch in spawned if p.args[1:4] == ["-m", "prefect", "server"]])
"""


def test_the_private_server_starts_before_torch_and_a_config_error_after_it_stops_it(tmp_path):
    """The server's process is spawned before the CLI imports torch (start-up and import overlap), and a config error
    found after that is one line, with the server already stopped when the CLI returns (not left to the kernel at
    exit). The error is injected at the import that follows the spawn, so the server is stopped while it starts."""
    argv = ["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--orchestrator", "prefect", "--quiet",
            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    done = subprocess.run([sys.executable, "-c", SPY, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env(PREFECT_HOME=str(tmp_path / "prefect")))
    assert done.stdout.strip().splitlines()[-1] == "2 [(False, True)]", done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == ["error: dataset_root: an error found after the server was spawned"]
    assert list((tmp_path / "prefect").glob("clipcache-private-*.log")) == []  # close() ran: it removes the log
