"""A whole dataset source from another package (entry point group ``clipcache.dataset_sources``): the example
package's ``shapes_of/<colour>`` family is resolved by the lookup, suggested for typos, listed by `clipcache datasets`
and evaluated; a broken plugin source is one line naming its entry point while built-in names keep working.

Entry points are read once per process, so each check runs in a fresh interpreter. The example's entry point is the
one its pyproject.toml declares, made discoverable through a dist-info folder on the path when the installed copy of
the example package predates it (as test_plugins.py does for its broken packages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from test_plugins import _fake_distribution

from conftest import REPO

EXAMPLE = REPO / "examples" / "clipcache-plugin-example"
GROUP = "clipcache.dataset_sources"


def _python(site: Path, code: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(EXAMPLE), str(REPO)]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _clipcache(site: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return _python(site, "import sys; from clipcache.flows.cli import main; sys.exit(main(sys.argv[1:]))", *argv,
                   cwd=cwd)


@pytest.fixture(scope="module")
def example_site(tmp_path_factory) -> Path:
    declared = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]
    assert declared[GROUP] == {"shapes_of_colour": "clipcache_plugin_example.colour_source:ShapesOfColour"}
    site = tmp_path_factory.mktemp("site")
    installed = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    if "shapes_of_colour" not in installed:  # an install of the example made before it had a source
        lines = "".join(f"{name} = {value}\n" for name, value in declared[GROUP].items())
        _fake_distribution(site, "clipcache_plugin_example_source", f"[{GROUP}]\n{lines}")
    return site


LOOKUP = textwrap.dedent("""
    import json
    from clipcache.storage.errors import DatasetError
    from clipcache.tasks.datasets import SOURCES, check_name, dataset_catalog, default_task, open_dataset
    out = {"origin": SOURCES.origin("shapes_of_colour"), "task": default_task("shapes_of/red", None)}
    try:
        check_name("shapes_of/rde")
    except DatasetError as e:
        out["typo"] = str(e)
    check_name("cifar10")  # the built-in names keep their meaning
    out["cifar10"] = default_task("cifar10", None)
    ds = open_dataset("shapes_of/blue", None, "test", 12)
    out["open"] = [len(ds), sorted({s.colour for s in ds.samples}), ds.labels.tolist(), ds.prompts.classnames]
    out["records"] = [[r.name, list(r.sources), r.origin] for r in dataset_catalog() if r.family == "shapes_of"]
    print(json.dumps(out))
""")


def test_a_plugin_source_is_resolved_suggested_listed_and_opened(example_site, tmp_path):
    from clipcache.tasks.datasets.shapes import COLOURS, SHAPES

    done = _python(example_site, LOOKUP, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "shapes_of_colour = clipcache_plugin_example.colour_source:ShapesOfColour" in out["origin"]
    assert out["task"] == "zeroshot_classification" and out["cifar10"] == "zeroshot_classification"
    assert "Unknown dataset 'shapes_of/rde'. Did you mean: shapes_of/red" in out["typo"]
    n, colours, labels, classnames = out["open"]
    assert n == 12 and colours == ["blue"] and set(labels) <= set(range(5)) and len(set(labels)) == 5
    assert classnames == [f"blue {shape}" for shape in SHAPES]
    assert [r[0] for r in out["records"]] == [f"shapes_of/{c}" for c in COLOURS]  # the plugin's list is the data's
    assert all(r[1] == ["shapes_of_colour"] and out["origin"] == r[2] for r in out["records"])

    listing = _clipcache(example_site, "datasets", "--cache_dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    rows = table_rows(listing.stdout)
    assert {f"shapes_of/{c}" for c in COLOURS} <= set(rows) and "cifar10" in rows
    assert "entry point shapes_of_colour = " in rows["shapes_of/red"]  # the source that reads it is named


def table_rows(table: str) -> dict[str, str]:
    """A rich table's rows by their first cell, each row's wrapped lines joined."""
    rows: dict[str, str] = {}
    name = ""
    for line in (line for line in table.splitlines() if line.startswith("│")):
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        name = cells[0] or name
        rows[name] = " ".join(filter(None, (rows.get(name, ""), *cells[1:])))
    return rows


@pytest.mark.slow  # a whole eval in a fresh interpreter (about 20 s on 2 shared cores)
def test_a_plugin_source_evaluates_like_a_builtin_dataset(example_site, tmp_path):
    run = _clipcache(example_site, "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes_of/green", "--limit",
                     "20", "--output_dir", "out", "--cache_dir", "cache", "--quiet", "--orchestrator", "local",
                     cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    [path] = (tmp_path / "out").rglob("shapes_of*green*.json")
    result = json.loads(path.read_text())
    assert result["task"] == "zeroshot_classification"
    assert result["metrics"]["acc1"] == pytest.approx(_direct_acc1("green", 20), abs=1e-12)
    assert result["metrics"]["acc1"] > 0.6  # five shapes of one colour: the bundled model tells them apart


def _direct_acc1(colour: str, n: int) -> float:
    """acc1 of the bundled model used directly with open_clip on the first n shapes of ``colour`` (clip_benchmark's
    classifier: normalised template embeddings averaged and normalised again)."""
    import numpy as np
    import open_clip
    import torch
    import torch.nn.functional as F

    from clipcache.tasks.datasets.shapes import SHAPES, TEMPLATES, load_shapes, render

    from conftest import TINY_MODEL

    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{TINY_MODEL}", device="cpu")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{TINY_MODEL}")
    model.eval()
    samples = [s for s in load_shapes("shapes", "zeroshot_classification", "test", None).samples
               if s.colour == colour][:n]
    with torch.inference_mode():
        images = F.normalize(model.encode_image(torch.stack([transform(render(s)) for s in samples])), dim=-1)
        classifier = torch.stack([F.normalize(F.normalize(model.encode_text(tokenizer(
            [t.format(c=f"{colour} {shape}") for t in TEMPLATES])), dim=-1).mean(0), dim=0) for shape in SHAPES])
    predicted = (images @ classifier.T).argmax(1).numpy()
    return float((predicted == np.array([SHAPES.index(s.shape) for s in samples])).mean())


def test_a_bad_name_with_the_plugin_source_installed_imports_nothing_heavy(example_site, tmp_path):
    """The name check imports the plugin's source module (it must be asked): the example's stays light."""
    from test_name_errors_light import HEAVY

    code = ("import json, sys\nfrom clipcache.tasks.datasets import check_name\ntry:\n    check_name('cifar1O')\n"
            "except Exception as e:\n    print(json.dumps([str(e), sorted(sys.modules)]))")
    done = _python(example_site, code, cwd=tmp_path)
    message, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert "Did you mean: cifar10" in message and "clipcache_plugin_example.colour_source" in modules
    assert not [m for m in modules if m.split(".")[0] in HEAVY]


RAISING = textwrap.dedent("""
    from clipcache.tasks.datasets.source import DatasetSource


    class Raising(DatasetSource):
        name = "raising_source"

        def claims(self, ref):
            raise RuntimeError("a bug in claims")

        def task(self, ref):
            return "zeroshot_classification"

        def open(self, ref, split, limit, options):
            raise RuntimeError("never opened")

        def records(self):
            raise RuntimeError("a bug in records")
""")


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    (site / "raising_source_plugin.py").write_text(RAISING, encoding="utf-8")
    return _fake_distribution(site, "broken_sources", """
        [clipcache.dataset_sources]
        broken_source = no_such_module_xyz:Source
        not_a_source = json:dumps
        raising_source = raising_source_plugin:Raising
    """)


def test_a_broken_plugin_source_is_one_line_and_builtin_names_keep_working(broken_site, tmp_path):
    missing = ("dataset source 'broken_source' (entry point broken_source = no_such_module_xyz:Source "
               "(broken_sources)) cannot be imported: ModuleNotFoundError: No module named 'no_such_module_xyz'")
    wrong = "dataset source 'not_a_source' (entry point not_a_source = json:dumps (broken_sources)) is not a " \
            "DatasetSource (got function)"
    run = _clipcache(broken_site, "eval", "--model", "tiny-shapes-clip", "--dataset", "cifar1O", cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = [line for line in run.stderr.strip().splitlines() if "left out" not in line]
    assert "Unknown dataset 'cifar1O'. Did you mean: cifar10" in line and missing in line and wrong in line
    assert "(broken_sources)) failed: RuntimeError: a bug in claims" in run.stderr  # a warning line, the lookup goes on

    run = _clipcache(broken_site, "datasets", "--cache_dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert {"cifar10", "wilds/iwildcam", "mieb:<mteb task name>"} <= set(table_rows(run.stdout))
    assert run.stderr.count(missing) == 1 and run.stderr.count(wrong) == 1  # warned once each, in one line
    assert "dataset source 'raising_source' (entry point raising_source = raising_source_plugin:Raising " \
           "(broken_sources)) failed: RuntimeError: a bug in records" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 3
