"""The package as users install it: a wheel built from the checkout, installed into a new virtual environment and run
from a folder outside the checkout, with its site-packages/clipcache read-only (and checked unchanged afterwards:
as root, file modes stop nothing). The dependencies are .venv's, reached through a folder of links that leaves out
.venv's editable clipcache and the example plugin; clipcache's own files come from the wheel only.

Also: the wheel holds every file git tracks under flows/, tasks/, storage/ and dbt_reports/, and the sdist, unpacked
and built, gives the same wheel contents."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from clipcache._version import VERSION

from conftest import REPO
from test_deployments import _stop, _wait_for_run, prefect_api  # noqa: F401  (prefect_api: a fixture)

pytestmark = pytest.mark.slow
PACKAGED = {"flows": "clipcache/flows", "tasks": "clipcache/tasks", "storage": "clipcache/storage",
            "dbt_reports": "clipcache/dbt_reports"}
LEFT_OUT = ("clipcache", "__editable__", "clipcache_plugin_example", "_clipcache")


def _build(*args: str, cwd: Path = REPO) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # pip --python must not see the checkout
    done = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return sorted(n for n in z.namelist() if not n.endswith("/RECORD"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`python -m pip wheel --no-deps --no-build-isolation -w dist .` in the checkout, as the README says."""
    dist = tmp_path_factory.mktemp("dist")
    _build("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), ".")
    [built] = dist.glob("clipcache-*.whl")
    return built


# As root, file modes stop nothing: the commands then run in a mount namespace where the package is a read-only
# bind mount (where unshare works), and in any case the package is checked unchanged afterwards.
READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'


def _read_only_guard(package: Path) -> list[str]:
    if os.geteuid() != 0:
        return []  # the modes below are enough
    guard = ["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY, str(package)]
    try:
        probe = subprocess.run([*guard, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return guard if probe.returncode == 0 else []


@dataclass
class Installed:
    python: Path
    package: Path
    guard: list[str]  # the command prefix that makes the package read-only (empty: file modes do, or nothing can)

    def command(self, argv: tuple[str, ...]) -> list:
        # prefect's own command is .venv's (it runs .venv's interpreter): `python -m prefect` is it in this venv
        head = [self.python, "-m", "prefect"] if argv[0] == "prefect" else [self.python.parent / argv[0]]
        return [*self.guard, *head, *argv[1:]]

    def run(self, cwd: Path, env: dict[str, str], *argv: str, timeout: float = 300) -> str:
        done = subprocess.run(self.command(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{argv}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done.stdout


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A new venv from the base interpreter with only the wheel installed (pip --python); .venv's other packages
    through a .pth naming a folder of links. The installed package is read-only."""
    root = tmp_path_factory.mktemp("installed")
    subprocess.run([Path(sys.base_prefix, "bin", "python3"), "-m", "venv", "--without-pip", root / "venv"],
                   check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = root / "deps"
    deps.mkdir()
    ours = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p, "prefect").is_dir()))
    for entry in ours.iterdir():
        if not entry.name.startswith(LEFT_OUT) and not entry.name.endswith(".pth"):
            (deps / entry.name).symlink_to(entry)
    (site / "_clipcache_test_deps.pth").write_text(f"{deps}\n")
    _build("--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel))
    package = site / "clipcache"
    for path in [package, *package.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield Installed(python, package, _read_only_guard(package))
    for path in [package, *package.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def _env(python: Path, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "PYTHON", "VIRTUAL_ENV", "CLIPCACHE_"))}
    env.update({"PATH": f"{python.parent}{os.pathsep}{env.get('PATH', '')}", "PREFECT_HOME": str(home),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
                "PREFECT_LOGGING_LEVEL": "WARNING", **extra})
    return env


def test_the_wheel_holds_every_file_git_tracks_in_the_packages(wheel):
    tracked = subprocess.run(["git", "ls-files", "--", *PACKAGED], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    expected = {PACKAGED[f.split("/", 1)[0]] + "/" + f.split("/", 1)[1] for f in tracked
                if "/tests/" not in f and "/docs/" not in f}
    names = set(_names(wheel))
    assert expected and expected <= names, sorted(expected - names)
    assert not {n for n in names if re.search(r"(^|/)(target|logs|dbt_packages|__pycache__)/|\.pyc$", n)}
    meta = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info/METADATA")
    text = meta.decode()
    for line in ("License-Expression: MIT", "Requires-Python: <3.12,>=3.11", "Project-URL: Source",
                 "Classifier: Programming Language :: Python :: 3.11", "Description-Content-Type: text/markdown"):
        assert line in text, line
    assert "License-File: LICENSE" in text and "# clipcache" in text


def test_the_sdist_unpacked_and_built_gives_the_same_wheel(wheel, tmp_path):
    done = subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; "
                           f"print(b.build_sdist({str(tmp_path / 'sdist')!r}))"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [sdist] = (tmp_path / "sdist").glob("clipcache-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    [source] = (tmp_path / "unpacked").iterdir()
    assert not (source / ".git").exists() and (source / "LICENSE").is_file()
    _build("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "again"), ".", cwd=source)
    [again] = (tmp_path / "again").glob("clipcache-*.whl")
    assert _names(again) == _names(wheel)
    # the source commit the sdist recorded is the one the wheel from the checkout says
    with zipfile.ZipFile(again) as a, zipfile.ZipFile(wheel) as w:
        assert json.loads(a.read("clipcache/_build.json")) == json.loads(w.read("clipcache/_build.json"))


def test_installed_wheel_runs_the_demo_report_suites_compare_and_a_worker_deployment(venv, request, tmp_path):
    python, package, run = venv.python, venv.package, venv.run
    before = _snapshot(package)
    work = tmp_path / "team"  # outside the checkout; the project folder `clipcache init` writes
    home = tmp_path / "prefect-home"
    env = _env(python, home)
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()

    # which copy runs: the installed one, with no checkout on sys.path
    probe = ("import json, sys, importlib.util as u, clipcache, clipcache.tasks.datasets as d; "
             "print(json.dumps([clipcache.__file__, d.__file__, sys.path, [n for n in ('flows', 'tasks', 'storage') "
             "if u.find_spec(n)]]))")
    tmp_path.joinpath("empty").mkdir()
    where, sub, path, generic = json.loads(run(tmp_path / "empty", env, "python", "-c", probe))
    assert Path(where) == package / "__init__.py" and Path(sub).is_relative_to(package)
    assert not generic and not [p for p in path if p and Path(p).resolve().is_relative_to(REPO.resolve())], path
    if venv.guard or os.geteuid() != 0:  # (as root without a mount namespace, only the final snapshot checks)
        write = f"import pathlib\ntry:\n pathlib.Path({str(package / 'x')!r}).touch()\nexcept OSError as e:\n print(e.errno)"
        assert run(tmp_path / "empty", env, "python", "-c", write).strip() in {str(errno.EROFS), str(errno.EACCES)}
    assert run(tmp_path / "empty", env, "clipcache", "--version").strip() == \
        f"clipcache {VERSION} (commit {head}) from {package}"
    assert run(tmp_path / "empty", env, "python", "-m", "clipcache", "--version").startswith(f"clipcache {VERSION} ")

    # the deployments' folder, the demo's evaluation in it, and the read-only commands
    assert "wrote" in run(tmp_path, env, "clipcache", "init", str(work))
    out = run(work, env, "clipcache", "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes",
               "shapes_retrieval", "--output_dir", "outputs", "--cache_dir", "cache")
    assert "shapes_retrieval" in out and "0.9825" in out
    # a second experiment without encoding an image: the same model with another prompt template (a what-if)
    (tmp_path / "templates.json").write_text('["a blurry photo of a {c}."]')
    run(work, env, "clipcache", "rescore", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--templates",
         str(tmp_path / "templates.json"), "--output_dir", "outputs", "--cache_dir", "cache")
    # the two experiments, oldest first, and the run rows so far (only eval and rescore write runs) in one query
    versions = ("count(*) AS n, list(DISTINCT clipcache_version) AS versions, (SELECT list(DISTINCT "
                "clipcache_version) FROM metrics) AS metric_versions")
    experiments = ("(SELECT list(experiment_id ORDER BY t) FROM (SELECT experiment_id, min(created_at) AS t "
                   "FROM metrics WHERE dataset = 'shapes' GROUP BY 1)) AS experiments")
    [before_worker] = json.loads(run(work, env, "clipcache", "query", f"SELECT {experiments}, {versions} FROM runs",
                                     "--format", "json"))
    baseline, candidate = before_worker.pop("experiments")
    compared = json.loads(run(work, env, "clipcache", "compare", "--baseline", baseline, "--candidate",
                               candidate, "--bootstrap", "200", "--format", "json"))
    assert {(r["metric"], r["n"]) for r in compared} >= {("acc1", 1200), ("acc5", 1200)}
    run(work, env, "clipcache", "report")
    assert (work / "outputs" / "report" / "index.html").stat().st_size > 1000
    assert (work / "outputs" / "report" / "reports.duckdb").is_file()
    assert "cifar10" in run(work, env, "clipcache", "datasets")
    scores = json.loads(run(work, env, "clipcache", "suite", "score", "shapes", "--bootstrap", "0",
                             "--format", "json"))
    assert "tiny-shapes-clip" in json.dumps(scores)

    # the README's worker steps: a process work pool, `prefect deploy --all`, a worker, a triggered nightly run.
    # The server (a module fixture) starts here, where it is first needed, not idling through the steps above.
    api = request.getfixturevalue("prefect_api")
    env = _env(python, home, PREFECT_API_URL=api, PREFECT_WORKER_QUERY_SECONDS="1",
               PREFECT_WORKER_PREFETCH_SECONDS="1")
    run(work, env, "prefect", "work-pool", "create", "clipcache", "--type", "process")
    # the worker polls the pool from now on: it starts up while `prefect deploy` runs, not after it
    worker = subprocess.Popen(venv.command(("prefect", "worker", "start", "--pool", "clipcache")), cwd=work,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run(work, env, "prefect", "--no-prompt", "deploy", "--all")
        triggered = run(work, env, "prefect", "deployment", "run", "evaluate-suite/nightly-evaluate")
        run_id = re.search(r"UUID: ([0-9a-f-]{36})", triggered)[1]
        finished = _wait_for_run(api, run_id, 300, [worker])
        worker.terminate()  # it shuts down (seconds) while the checks below run
        assert finished["state"]["type"] == "COMPLETED", finished["state"]
        deployment = httpx.get(f"{api}/deployments/{finished['deployment_id']}").json()
        assert deployment["entrypoint"] == "clipcache.flows.orchestration.flows:evaluate_suite"
        # every run row says which release and commit made it; the worker's run added rows
        [after_worker] = json.loads(run(work, env, "clipcache", "query", f"SELECT {versions} FROM runs",
                                        "--format", "json"))
    finally:
        _stop(worker)
    for rows in (before_worker, after_worker):
        assert rows["versions"] == rows["metric_versions"] == [f"{VERSION}+g{head}"], rows
    assert after_worker["n"] > before_worker["n"]

    assert _snapshot(package) == before  # nothing written into the installed package
