"""One import root: the installed distribution exposes ``clipcache`` only; the repository's flows/, tasks/ and
storage/ folders install as ``clipcache.flows`` / ``clipcache.tasks`` / ``clipcache.storage``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import REPO


def test_generic_top_level_names_are_not_importable_from_elsewhere(tmp_path):
    probe = ("import importlib.util as u, clipcache.flows, clipcache.tasks.datasets, clipcache.storage.results; "
             "print([n for n in ('flows', 'tasks', 'storage') if u.find_spec(n) is not None])")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_source_package_is_packaged():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    found = set()
    for top, package in config["package-dir"].items():
        for init in Path(REPO, package).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / package)
            found.add(".".join([top, *rel.parts]))
    assert found == declared - {"clipcache.dbt_reports"}  # the dbt project: data only, no __init__.py
    # a checkout has the installed layout too: clipcache/<name> links to each folder the package maps
    for top, package in config["package-dir"].items():
        if top != "clipcache":
            link = REPO / "clipcache" / top.split(".", 1)[1]
            assert link.is_symlink() and link.resolve() == (REPO / package).resolve(), link


def test_version_names_the_release_the_commit_and_the_copy(capsys):
    import pytest

    import clipcache
    from clipcache._version import VERSION
    from clipcache.flows.cli import main
    from clipcache.tasks.results import clipcache_version

    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    here = Path(clipcache.__file__).resolve().parent
    assert capsys.readouterr().out.strip() == f"clipcache {VERSION} (commit {head}) from {here}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert clipcache.__version__ == VERSION and project["project"]["dynamic"] == ["version"]  # one place
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "clipcache._version.VERSION"}
    assert clipcache_version() == f"{VERSION}+g{head}"  # what every run and metric row records


def test_python_dash_m_clipcache_is_the_cli(tmp_path):
    done = subprocess.run([sys.executable, "-m", "clipcache", "--version"], capture_output=True, text=True, cwd=tmp_path,
                          check=True)
    assert done.stdout.startswith("clipcache ") and " (commit " in done.stdout


def test_init_writes_the_shipped_deployments_once(tmp_path, capsys):
    from clipcache.flows.cli import main
    from clipcache.flows.orchestration.deployments import load_suite, read_deployments

    assert main(["init", str(tmp_path / "team")]) == 0
    written = tmp_path / "team"
    assert (written / "prefect.yaml").read_bytes() == (REPO / "prefect.yaml").read_bytes()
    assert (written / "suites" / "nightly.yaml").read_bytes() == (REPO / "suites" / "nightly.yaml").read_bytes()
    assert {d["entrypoint"] for d in read_deployments(written / "prefect.yaml")} == {
        "clipcache.flows.orchestration.flows:evaluate_suite", "clipcache.flows.orchestration.flows:report", "clipcache.flows.orchestration.flows:convert"}
    assert load_suite(written / "suites" / "nightly.yaml").datasets == ["shapes", "shapes_retrieval"]
    (written / "suites" / "nightly.yaml").write_text("models: [{model_name: mine}]\ndatasets: [shapes]\n")
    (written / "prefect.yaml").unlink()
    capsys.readouterr()
    assert main(["init", str(written)]) == 2  # one file there: nothing written, that file named
    err = capsys.readouterr().err
    assert "nightly.yaml already exists" in err and len(err.strip().splitlines()) == 1
    assert not (written / "prefect.yaml").exists() and "mine" in (written / "suites" / "nightly.yaml").read_text()
