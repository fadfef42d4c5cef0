"""Hostile names on the terminal and oversized suite files (issue #45, case 7): a dataset, model or suite name is
printed as it is written, never read as Rich markup (`[/]x[bold]` stopped commands with a MarkupError traceback,
`[link=...]` became a clickable link in the compare table), and a 50 MB suite file is refused in one line at once."""

from __future__ import annotations

import json

import pytest

from conftest import perturbed_tiny_model, write_wds
from hostile import assert_refused, run_cli

pytestmark = pytest.mark.hostile

NAMES = ["wds/[/]x[bold]", "wds/[link=http://127.0.0.1:9/]evil[/link]"]
COMMON = ["--quiet", "--orchestrator", "local"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Two checkpoints (the bundled model and a perturbed copy) evaluated on one webdataset folder under two
    hostile names; a suite file that lists both names with markup display names."""
    from clipcache.flows.cli import main

    root = tmp_path_factory.mktemp("hostile-names")
    write_wds(root / "wds", "classification", 16, n_classes=5)
    perturbed_tiny_model(root / "perturbed")
    dirs = ["--output_dir", str(root / "out"), "--cache_dir", str(root / "cache"), "--dataset_root", str(root / "wds")]
    assert main(["eval", "--model", "tiny-shapes-clip", f"local-dir:{root / 'perturbed'}", "--dataset", *NAMES,
                 *COMMON, *dirs]) == 0
    suite = root / "suite.yaml"
    suite.write_text(json.dumps({"name": "[bold]hostile[/]", "description": "[link=http://127.0.0.1:9/]x[/link]",
                                 "datasets": [{"dataset": n, "name": f"[red]{n}[/red]"} for n in NAMES]}))
    return root


def _assert_printed_as_is(code: int, out: str, err: str, *names: str) -> None:
    assert code == 0, err
    assert "Traceback" not in out + err and "MarkupError" not in out + err
    for name in names:
        assert name in out, f"{name!r} not printed as it is:\n{out}"
    assert "\x1b]8;" not in out  # no OSC 8 hyperlink reached the terminal


def test_eval_results_table_prints_names_as_they_are(work, capsys):
    code, out, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", *NAMES, "--orchestrator", "local",
                              "--output_dir", str(work / "out"), "--cache_dir", str(work / "cache"), "--dataset_root",
                              str(work / "wds")], capsys)
    _assert_printed_as_is(code, out, err, *NAMES)


def test_compare_table_prints_names_as_they_are(work, capsys):
    code, out, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", "perturbed",
                              "--output_dir", str(work / "out"), "--bootstrap", "10"], capsys)
    _assert_printed_as_is(code, out, err, NAMES[0], "wds/[link=http://1")  # the column cuts the second short


@pytest.mark.parametrize("command", ["show", "score"])
def test_suite_tables_print_names_as_they_are(work, capsys, command):
    argv = ["suite", command, str(work / "suite.yaml")]
    if command == "score":
        argv += ["--output_dir", str(work / "out"), "--bootstrap", "0"]
    code, out, err = run_cli(argv, capsys)
    if command == "score":
        _assert_printed_as_is(code, out, err, "suite [bold]hostile[/] (2 datasets)")
    else:
        _assert_printed_as_is(code, out, err, *[f"[red]{n}[/red]" for n in NAMES], "[bold]hostile[/]",
                              "[link=http://127.0.0.1:9/]x[/link]")


def test_query_and_cache_tables_print_names_as_they_are(work, capsys):
    code, out, err = run_cli(["query", "SELECT DISTINCT dataset FROM metrics ORDER BY 1", "--output_dir",
                              str(work / "out")], capsys)
    _assert_printed_as_is(code, out, err, *NAMES)
    code, out, err = run_cli(["cache", "ls", "--cache_dir", str(work / "cache")], capsys)
    _assert_printed_as_is(code, out, err, NAMES[0])


def test_an_error_naming_markup_is_one_plain_line(work, capsys):
    code, _, err = run_cli(["compare", "--baseline", "[/]x[bold]", "--candidate", "[link=http://127.0.0.1:9/]y",
                            "--output_dir", str(work / "out")], capsys)
    assert_refused(code, err, "[/]x[bold]")


def test_a_huge_suite_file_is_refused_in_one_line_unparsed(tmp_path, capsys, monkeypatch):
    """50 MB of valid YAML (it parses for minutes at gigabytes) is refused before any of it is parsed."""
    import yaml

    suite = tmp_path / "huge.yaml"
    line = "  - dataset: cifar10\n"
    with suite.open("w") as f:
        f.write("name: huge\ndatasets:\n")
        f.write(line * (50_000_000 // len(line)))
    parsed = []

    def parse(text):  # what happened before the bound: minutes of parsing; here a fast failure instead
        parsed.append(len(text))
        raise yaml.YAMLError("parsed in full")

    monkeypatch.setattr(yaml, "safe_load", parse)
    for argv in (["suite", "show", str(suite)], ["suite", "score", str(suite), "--output_dir", str(tmp_path)],
                 ["eval", "--suite", str(suite), "--model", "tiny-shapes-clip", *COMMON]):
        code, _, err = run_cli(argv, capsys)
        assert_refused(code, err, "larger than 1,000,000 bytes")
        assert str(suite) in err
    assert parsed == []
    # the same refusal for a published table of `suite check`
    (tmp_path / "warehouse" / "metrics").mkdir(parents=True)  # an empty warehouse
    published = tmp_path / "published.csv"
    published.write_bytes(b"name,pretrained,cifar10\n" + b"m,,0.5\n" * 3_000_000)
    code, _, err = run_cli(["suite", "check", "shapes", "--published", str(published), "--output_dir",
                            str(tmp_path)], capsys)
    assert_refused(code, err, "larger than 20,000,000 bytes")
