"""The typed task contract (tasks/contract.py, tasks/evaluation/base.py): the session protocol is what the flows'
ModelSession gives, the contract and the probe family import no numpy or torch, and the probe family declares its
prepare and encode once (tasks/evaluation/probes.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clipcache.tasks.contract import EncodeSession
from clipcache.tasks.evaluation import TASKS, get_task
from clipcache.tasks.evaluation.probes import ProbeTask

from conftest import REPO

PROBES = ("linear_probe", "mieb_linear_probe", "knn_classification", "multilabel_probe", "image_clustering")


def test_the_model_session_has_every_member_of_the_protocol():
    from clipcache.tasks.encode.stage import ModelSession

    members = [name for name in vars(EncodeSession) if not name.startswith("_")]
    assert {"resolved", "device", "precision", "decode", "model"} <= set(members)
    fields = ModelSession.__dataclass_fields__
    missing = [name for name in members if name not in fields and not hasattr(ModelSession, name)]
    assert not missing, f"ModelSession lacks {missing}"


def test_the_contract_and_the_probe_family_import_no_numpy_or_torch():
    modules = ["clipcache.tasks.contract", "clipcache.tasks.evaluation.base", "clipcache.tasks.evaluation.probes",
               *(f"clipcache.tasks.evaluation.{name}" for name in PROBES)]
    code = (f"import importlib, json, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            "print(json.dumps([m for m in ('numpy', 'torch', 'zarr') if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("name", PROBES)
def test_a_probe_declares_no_prepare_or_encode_of_its_own(name):
    task = type(get_task(name))
    assert issubclass(task, ProbeTask)
    assert "prepare" not in vars(task) and "encode" not in vars(task), f"{name}: ProbeTask's prepare/encode"
    assert task.needs == ("image",) and task.reads == ("classification",)


def test_every_registered_task_is_typed_with_what_it_prepares():
    """Each built-in task names its payload type (EvalTask[...]), so mypy checks its prepare, encode and score
    against one another."""
    untyped = []
    for name in TASKS.names():
        task = type(get_task(name))
        if not task.__module__.startswith("clipcache."):
            continue  # a plugin may leave EvalTask unparametrised
        bases = [b for klass in task.__mro__ for b in getattr(klass, "__orig_bases__", ())]
        if not any(getattr(b, "__args__", None) for b in bases):
            untyped.append(name)
    assert not untyped, f"subclass EvalTask[<what prepare opens>]: {untyped}"
