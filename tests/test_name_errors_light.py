"""A mistyped --dataset or --model is one line, found before anything heavy is imported: neither NumPy, Arrow, PIL
nor torch (the dataset sources whose modules import them are known not to claim the name without importing them:
tasks/datasets/declared.py, the sources' own declarations, checked here against what the classes claim)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clipcache.tasks import datasets
from clipcache.tasks.datasets.declared import BUILTIN_SOURCES
from clipcache.tasks.datasets.source import DatasetRef

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "pyarrow", "PIL", "torch", "open_clip", "zarr", "prefect")


def run_cli(argv: list[str]) -> tuple[int, list[str], str]:
    """(exit code, modules imported, stderr) of ``clipcache`` + argv in a fresh interpreter."""
    code = (f"import sys, json\nfrom clipcache.flows.cli import main\ntry:\n    rc = main({argv!r})\n"
            "except SystemExit as e:\n    rc = e.code\nprint(json.dumps([rc, sorted(sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    rc, modules = json.loads(done.stdout.strip().splitlines()[-1])
    return rc, modules, done.stderr


@pytest.mark.parametrize(("argv", "says"), [
    (["eval", "--model", "tiny-shapes-clip", "--dataset", "cifar1O"], "Unknown dataset 'cifar1O'. Did you mean"),
    (["eval", "--model", "tiny-shapes-clop", "--dataset", "cifar10"], "Unknown model 'tiny-shapes-clop'"),
    (["rescore", "--model", "ViT-B-32", "--dataset", "wilds/iwildcm"], "Did you mean: wilds/iwildcam"),
])
def test_a_bad_dataset_or_model_name_is_one_line_without_heavy_imports(argv, says):
    rc, modules, stderr = run_cli(argv)
    assert rc == 2 and len(stderr.strip().splitlines()) == 1 and says in stderr, stderr
    assert stderr.startswith("error:"), stderr
    assert not [m for m in modules if m.split(".")[0] in HEAVY], argv


def test_the_sources_known_without_importing_them_claim_as_declared():
    """Each built-in source declared folder-only claims no name without a root (whatever the name); each declared
    with names suggests and claims exactly those. The declaration is the source's own (tasks/datasets/declared.py:
    one statement, read by the class and by the name check)."""
    names = ["cifar10", "wds/cifar10", "shapes", "misc/winogavil", "wilds/iwildcam", "mieb:CIRRIT2IRetrieval", "x"]
    assert set(BUILTIN_SOURCES) <= set(datasets.SOURCES.names())
    for source, spec in BUILTIN_SOURCES.items():
        obj = datasets.get_source(source)
        assert obj.declared is spec and datasets.SOURCES.get(source) is type(obj), source
        assert f"{type(obj).__module__}:{type(obj).__name__}" == spec.target, source
        if spec.folder_only:
            assert obj.known_names() == [], source
            assert not any(obj.claims(DatasetRef(name)) for name in names), source
        if spec.names is not None:
            own = spec.names()
            assert own and sorted(obj.known_names()) == sorted(own), source
            assert all(obj.claims(DatasetRef(name)) for name in own), source
            assert not any(obj.claims(DatasetRef(name)) for name in names if name not in own), source
    assert {s for s, spec in BUILTIN_SOURCES.items() if spec.folder_only or spec.names} >= {
        "beir", "any2any", "vidore", "group_layouts", "winogavil"}
