"""A mistyped --dataset or --model is one line, found before anything heavy is imported: neither NumPy, Arrow, PIL
nor torch (the dataset sources whose modules import them are known not to claim the name without importing them:
tasks/datasets/__init__.py FOLDER_ONLY and OWN_NAMES, checked here against the classes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clipcache.tasks import datasets
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
    """Each source in FOLDER_ONLY claims no name without a root (whatever the name); each in OWN_NAMES suggests
    and claims exactly its declared names. A new source or a changed one must update the declarations."""
    names = ["cifar10", "wds/cifar10", "shapes", "misc/winogavil", "wilds/iwildcam", "mieb:CIRRIT2IRetrieval", "x"]
    for source in datasets.FOLDER_ONLY:
        obj = datasets.get_source(source)
        assert obj.known_names() == [], source
        assert not any(obj.claims(DatasetRef(name)) for name in names), source
    for source, own in datasets.OWN_NAMES.items():
        obj = datasets.get_source(source)
        assert sorted(obj.known_names()) == sorted(own()), source
        assert all(obj.claims(DatasetRef(name)) for name in own()), source
        assert not any(obj.claims(DatasetRef(name)) for name in names if name not in own()), source
    assert {datasets.get_source(s).name for s in datasets.FOLDER_ONLY | set(datasets.OWN_NAMES)} == \
        datasets.FOLDER_ONLY | set(datasets.OWN_NAMES)
