"""Hostile export targets and cells (issue #45, cases 4 and 7): every output path of every command refuses the
results warehouse and any embedding cache (named or not, symlinks followed), and no CSV cell clipcache writes runs as
a spreadsheet formula (OWASP's CSV-injection rule: a text cell starting with = + - @ tab or CR gets a leading ')."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from pathlib import Path

import pytest

from clipcache.storage.spreadsheet import formula_safe

from hostile import Tree, assert_refused, run_cli
from test_warehouse import T0, write_run

pytestmark = pytest.mark.hostile

FORMULA_NAME = '=HYPERLINK("http://127.0.0.1:9/x","click")'
FORMULA_MODEL = "@SUM(1+1)*cmd|' /C calc'!A0"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A real embedding cache (one evaluation of the bundled model) and a warehouse with a `cifar10` result of a
    model whose name is a formula, plus a suite file whose display name is one."""
    from clipcache.flows.cli import main

    root = tmp_path_factory.mktemp("hostile-exports")
    out, cache = root / "out", root / "cache"
    assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "8", "--quiet",
                 "--orchestrator", "local", "--output_dir", str(out), "--cache_dir", str(cache)]) == 0
    late = T0 + timedelta(days=400)
    write_run(out, late, [{"model": FORMULA_MODEL, "dataset": "cifar10", "value": 0.4321},
                          {"model": "tiny-shapes-clip", "dataset": "cifar10", "value": 0.25}])
    (root / "suite.yaml").write_text("name: hostile\ndatasets:\n  - dataset: cifar10\n"
                                     f"    name: '{FORMULA_NAME}'\n")
    return root


def entry(work: Path) -> Path:
    return next((work / "cache" / "embeddings").glob("*.zarr"))


def export(work: Path, fmt: str, out: Path | str, *extra: str) -> list[str]:
    return ["suite", "export", str(work / "suite.yaml"), "--format", fmt, "--out", str(out),
            "--output_dir", str(work / "out"), *extra]


def _link(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(target)
    return link


# Where an export must never land: inside the cache, named by its flag or not, directly or through links.
TARGETS = {
    "an entry's zarr.json": lambda w: entry(w) / "zarr.json",
    "a new file in an entry": lambda w: entry(w) / "export.csv",
    "the cache's root": lambda w: w / "cache" / "export.csv",
    "a link to an entry": lambda w: _link(w / "links" / "entry", entry(w)) / "zarr.json",
    "a link to zarr.json": lambda w: _link(w / "links" / "meta.csv", entry(w) / "zarr.json"),
    "a dangling link into the cache": lambda w: _link(w / "links" / "new.csv", w / "cache" / "embeddings" / "n.csv"),
}


@pytest.mark.parametrize("named", [True, False], ids=["cache_dir named", "cache found by its layout"])
@pytest.mark.parametrize("where", list(TARGETS))
def test_suite_export_never_writes_into_the_cache(work, capsys, where, named):
    target = TARGETS[where](work)
    tree = Tree(work)
    extra = ["--cache_dir", str(work / "cache")] if named else []  # unnamed: the default `cache` is elsewhere
    code, _, err = run_cli(export(work, "openclip", target, *extra), capsys)
    assert_refused(code, err, "--out: ")
    assert "embedding cache" in err, err
    assert tree.changes() == (set(), set(), set())


@pytest.mark.parametrize("where", ["the cache", "its entries folder", "an entry", "a link to the cache"])
def test_mteb_export_never_writes_into_the_cache(work, capsys, where):
    target = {"the cache": work / "cache", "its entries folder": work / "cache" / "embeddings",
              "an entry": entry(work), "a link to the cache": _link(work / "links" / "cache", work / "cache")}[where]
    tree = Tree(work)
    code, _, err = run_cli(export(work, "mteb", target), capsys)
    assert_refused(code, err, "--out: ")
    assert "embedding cache" in err, err
    assert tree.changes() == (set(), set(), set())


def test_mteb_export_through_a_results_link_into_the_cache(work, capsys):
    """`--out` itself is a fresh folder, but its `results` is a link into the cache: refused before writing."""
    folder = work / "mteb-out"
    _link(folder / "results", work / "cache" / "embeddings")
    tree = Tree(work)
    code, _, err = run_cli(export(work, "mteb", folder), capsys)
    assert_refused(code, err, "embedding cache")
    assert tree.changes() == (set(), set(), set())


@pytest.mark.parametrize("command", ["query", "report", "report --compare"])
def test_every_out_refuses_a_cache_found_by_its_layout(work, capsys, command):
    """Commands not told where the cache is (`--cache_dir` left at its default) still find it by its layout."""
    tree = Tree(work)
    if command == "query":
        argv = ["query", "SELECT 1", "--format", "csv", "--output_dir", str(work / "out"), "--out",
                str(entry(work) / "zarr.json")]
    elif command == "report":
        argv = ["report", "--output_dir", str(work / "out"), "--out", str(entry(work) / "zarr.json")]
    else:
        argv = ["report", "--output_dir", str(work / "out"), "--compare", "a", "b", "--out", str(work / "cache")]
    code, _, err = run_cli(argv, capsys)
    assert_refused(code, err, "embedding cache")
    assert tree.changes() == (set(), set(), set())


def test_eval_output_template_never_writes_into_the_cache(work, capsys):
    """clip_benchmark's --output pattern is an output path too: refused before any work."""
    tree = Tree(work)
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "8", "--quiet",
                            "--orchestrator", "local", "--output_dir", str(work / "out2"), "--cache_dir",
                            str(work / "cache"), "--output", str(entry(work) / "{dataset}.json")], capsys)
    assert_refused(code, err, "embedding cache")
    tree.assert_unchanged(work / "cache")
    assert not (work / "out2" / "warehouse").exists()


# -- CSV cells -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell,expected", [
    ("=1+1", "'=1+1"), ("+1+1", "'+1+1"), ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"), ("\t=1", "'\t=1"),
    ("\r=1", "'\r=1"), ("-0.5", "-0.5"), ("+1e-3", "+1e-3"), ("plain", "plain"), ("", ""), ("a=b", "a=b"),
    (-0.5, -0.5), (None, None), ("-inf", "'-inf"), ("- 1", "'- 1")])
def test_formula_cells_are_neutralised(cell, expected):
    assert formula_safe(cell) == expected


def test_suite_export_csv_has_no_formula_cells(work, tmp_path, capsys):
    target = tmp_path / "openclip.csv"
    code, _, err = run_cli(export(work, "openclip", target), capsys)
    assert code == 0, err
    rows = list(csv.reader(io.StringIO(target.read_text())))
    cells = [c for row in rows for c in row]
    assert f"'{FORMULA_NAME}" in rows[0] and f"'{FORMULA_MODEL}" in [r[0] for r in rows]
    assert not [c for c in cells if c[:1] in ("=", "+", "@", "\t", "\r") or (c[:1] == "-" and not _number(c))]


def test_query_csv_has_no_formula_cells(work, tmp_path, capsys):
    quoted = FORMULA_MODEL.replace("'", "''")
    sql = f"SELECT model, -0.5 AS negative, '=cmd|'' /C calc''!A0' AS f FROM metrics WHERE model = '{quoted}'"
    for out in (None, tmp_path / "q.csv"):
        code, stdout, err = run_cli(["query", sql, "--format", "csv", "--output_dir", str(work / "out"),
                                     *(["--out", str(out)] if out else [])], capsys)
        assert code == 0, err
        text = out.read_text() if out else stdout
        assert list(csv.reader(io.StringIO(text)))[1] == [f"'{FORMULA_MODEL}", "-0.5", "'=cmd|' /C calc'!A0"]


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("where", ["an entry", "the entries folder", "a link into the cache"])
def test_results_folders_never_lie_inside_the_cache(work, capsys, where):
    """eval's and convert's --output_dir: result files would land among the cache's entries."""
    from clipcache.flows.config.convert_params import ConvertParams
    from clipcache.flows.config.params import validate
    from clipcache.storage.errors import ConfigError

    folder = {"an entry": entry(work) / "results", "the entries folder": work / "cache" / "embeddings",
              "a link into the cache": _link(work / "links" / "into-cache", work / "cache" / "embeddings")}[where]
    tree = Tree(work)
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "8", "--quiet",
                            "--orchestrator", "local", "--output_dir", str(folder)], capsys)
    assert_refused(code, err, "is inside the embedding cache")
    with pytest.raises(ConfigError, match="is inside the embedding cache"):
        validate(ConvertParams, {"models": [{"model_name": "m", "api_base": "http://127.0.0.1:9/v1"}],
                                 "datasets": ["shapes"], "output_dir": str(folder)})
    assert tree.changes() == (set(), set(), set())
