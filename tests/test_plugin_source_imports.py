"""When the plugins' dataset sources are read (entry point group ``clipcache.dataset_sources``): only for a name no
built-in source claims, and then once per process. Resolving, defaulting and opening clipcache's own names reads no
entry point and imports no plugin module; the example plugin's module is imported once however many names are
checked after that; a broken plugin's module is tried once and is one warning line, not one per check.

Counted in fresh interpreters (entry points are read once per process): a finder first on ``sys.meta_path`` sees
every attempt to import a module not yet imported (a failed import is attempted again on each ``import``), and a
wrapper of ``importlib.metadata.entry_points`` counts the scans of the group."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from test_plugin_sources import _python, broken_site, example_site  # noqa: F401 (the fixtures, asked by name)

COUNTED = textwrap.dedent("""
    import importlib.metadata, json, sys

    attempts = []

    class Counted:
        def find_spec(self, name, path=None, target=None):
            attempts.append(name)
            return None

    sys.meta_path.insert(0, Counted())
    scans = []
    _entry_points = importlib.metadata.entry_points

    def entry_points(**params):
        scans.append(params.get("group"))
        return _entry_points(**params)

    importlib.metadata.entry_points = entry_points
    from clipcache.storage.errors import DatasetError
    from clipcache.tasks.datasets import check_name, dataset_catalog, default_task, open_dataset

    def state(module):
        return {"attempts": attempts.count(module), "scans": scans.count("clipcache.dataset_sources"),
                "imported": module in sys.modules}

    def typo(name):
        try:
            check_name(name)
        except DatasetError as e:
            return str(e)

    out = {}
""")

BUILTIN_NAMES = textwrap.dedent("""
    for name in ("cifar10", "shapes", "wilds/iwildcam", "sugar_crepe/add_att", "imagenet1k"):
        check_name(name)
    check_name("any_name", sys.argv[1])  # a BEIR folder: claimed by a built-in source, not by a plugin's
    out["tasks"] = [default_task("shapes", None), default_task("cifar10", None), default_task("any", sys.argv[1])]
    out["opened"] = len(open_dataset("shapes", None, "test", 4))
""")


@pytest.fixture(scope="module")
def beir_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("beir")
    (root / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "a red circle"}) + "\n", encoding="utf-8")
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "circle"}) + "\n", encoding="utf-8")
    return root


def _run(site: Path, code: str, beir: Path, cwd: Path) -> dict:
    done = _python(site, COUNTED + code + "\nprint(json.dumps(out))\n", str(beir), cwd=cwd)
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def test_builtin_names_import_no_plugin_and_a_plugins_module_is_imported_once(request, beir_folder, tmp_path):
    module = "clipcache_plugin_example.colour_source"
    out = _run(request.getfixturevalue("example_site"), BUILTIN_NAMES + textwrap.dedent(f"""
        out["builtin"] = state({module!r})
        for name in ("shapes_of/red", "cifar10", "shapes_of/blue", "shapes_of/green"):
            check_name(name)
        out["plugin_tasks"] = [default_task("shapes_of/red", None), default_task("shapes", None)]
        out["plugin_opened"] = len(open_dataset("shapes_of/blue", None, "test", 6))
        out["typo"] = typo("shapes_of/rde")
        out["listed"] = sum(r.family == "shapes_of" for r in dataset_catalog())
        out["after"] = state({module!r})
    """), beir_folder, tmp_path)
    assert out["tasks"] == ["zeroshot_classification", "zeroshot_classification", "text_retrieval"]
    assert out["opened"] == 4
    assert out["builtin"] == {"attempts": 0, "scans": 0, "imported": False}  # nothing of the plugin yet
    assert out["plugin_tasks"] == ["zeroshot_classification"] * 2 and out["plugin_opened"] == 6
    assert "Did you mean: shapes_of/red" in out["typo"] and out["listed"] == 6
    assert out["after"] == {"attempts": 1, "scans": 1, "imported": True}  # once, for every later check too


def test_a_broken_plugin_is_tried_once_and_warned_once(request, beir_folder, tmp_path):
    missing = "no_such_module_xyz"
    out = _run(request.getfixturevalue("broken_site"), BUILTIN_NAMES + textwrap.dedent(f"""
        out["builtin"] = state({missing!r})
        out["typos"] = [typo("cifar1O"), typo("cifar1O"), typo("shapez")]
        dataset_catalog()
        out["after"] = state({missing!r})
    """), beir_folder, tmp_path)
    assert out["tasks"][2] == "text_retrieval" and out["opened"] == 4
    assert out["builtin"] == {"attempts": 0, "scans": 0, "imported": False}
    assert all("(Not asked: dataset source 'broken_source'" in t and "No module named 'no_such_module_xyz'" in t
               for t in out["typos"])
    assert out["after"] == {"attempts": 1, "scans": 1, "imported": False}  # tried once, reported on each use
    left_out = [line for line in out["stderr"].splitlines() if "dataset source left out" in line]
    assert sum(missing in line for line in left_out) == 1, out["stderr"]


def test_a_lazy_entry_that_fails_to_import_runs_once_and_is_reported_on_each_use(tmp_path, monkeypatch):
    from clipcache.tasks.registry import Registry

    runs = tmp_path / "runs.txt"
    (tmp_path / "fails_on_import_xyz.py").write_text(
        f"open({str(runs)!r}, 'a').write('ran\\n')\nraise ImportError('broken on purpose')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[object] = Registry("thing", LookupError, entry_point_group="clipcache.no_such_group_xyz")
    registry.register("broken", "fails_on_import_xyz:Thing")
    registry.register("fine", "json:dumps")
    assert registry.own_names() == ["broken", "fine"] and not registry._plugins_loaded
    assert registry.get("fine", plugins=False) is json.dumps and registry.origin("fine") == "clipcache"
    assert not registry._plugins_loaded  # a name registered here is found without reading the entry points
    messages = []
    for _ in range(3):
        with pytest.raises(LookupError) as e:
            registry.get("broken")
        messages.append(str(e.value))
        assert isinstance(e.value.__cause__, ImportError)
    assert messages == ["thing 'broken' (clipcache) cannot be imported: ImportError: broken on purpose"] * 3
    assert runs.read_text() == "ran\n"  # the module ran once
