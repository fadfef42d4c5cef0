"""Hostile files that carry code: nothing read from a dataset or model folder runs.

Each payload, if it ran, would create a canary file. Model folders that ask for their own code (a config's auto_map,
a sentence-transformers modules.json naming a foreign class, an open_clip config that turns trust_remote_code on or
names such a folder) and pickles (CIFAR batches, checkpoints, an object-array .npy in a webdataset shard, an MNIST
processed file) must each end in one line and a non-zero exit, with no canary and no result written.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from clipcache.storage.errors import DatasetError, ModelError
from clipcache.tasks.datasets.clip_benchmark.wds import read_npy
from clipcache.tasks.datasets.safe_pickle import DatasetUnpickler, load_dataset_pickle
from clipcache.tasks.models import custom_code

from conftest import TINY_MODEL, replace_tar_member, write_wds
from hf_fixtures import make_hf_model
from hostile import Tree, assert_refused, canary_payload, run_cli

pytestmark = pytest.mark.hostile

CLI = Path(sys.executable).parent / "clipcache"
CODE = "asks to run its own Python code"


class Exec:
    """Pickles as ``exec(source)``: what a hostile pickle runs on load."""

    def __init__(self, source: str):
        self.source = source

    def __reduce__(self):
        return exec, (self.source,)


class System:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture(scope="module")
def clean_hf(tmp_path_factory) -> Path:
    return make_hf_model(tmp_path_factory.mktemp("hf") / "clip", "clip")


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def eval_argv(work: Path, model: str, *rest: str) -> list[str]:
    dataset = rest or ("--dataset", "shapes")
    return ["eval", "--model", model, *dataset, "--limit", "4", "--quiet", "--orchestrator", "local",
            "--output_dir", str(work / "out"), "--cache_dir", str(work / "cache")]


def assert_refused_safely(work: Path, code: int, err: str, phrase: str) -> None:
    assert_refused(code, err, phrase)
    assert not (work / "canary").exists(), "the payload ran"
    out = work / "out"
    assert not [p for p in out.rglob("*.json") if "warehouse" not in p.parts], "a result file was written"
    assert not list((out / "warehouse" / "metrics").rglob("*.parquet")), "metric rows were written"


def custom_code_folder(clean: Path, work: Path, file: str = "config.json", model_type: str = "evil_clip") -> Path:
    """A copy of a tiny HF CLIP folder whose ``file`` maps the Auto classes to a module of its own that creates
    the canary when it is imported."""
    folder = work / "evil"
    shutil.copytree(clean, folder)
    data = json.loads((folder / file).read_text()) if (folder / file).exists() else {}
    if file == "config.json":
        data["model_type"] = model_type
    data["auto_map"] = {"AutoConfig": "evil_code.EvilConfig", "AutoModel": "evil_code.EvilModel",
                        "AutoTokenizer": ["evil_code.EvilTokenizer", None]}
    (folder / file).write_text(json.dumps(data))
    (folder / "evil_code.py").write_text(canary_payload(work / "canary") + "\n"
                                         "from transformers import CLIPConfig, CLIPModel\n"
                                         "class EvilConfig(CLIPConfig):\n    model_type = 'evil_clip'\n"
                                         "class EvilModel(CLIPModel):\n    config_class = EvilConfig\n")
    return folder


# -- model folders ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("file,model_type", [("config.json", "evil_clip"), ("config.json", "clip"),
                                             ("tokenizer_config.json", "clip"),
                                             ("preprocessor_config.json", "clip")])
def test_hf_folder_with_auto_map_is_refused(clean_hf, work, capsys, file, model_type):
    folder = custom_code_folder(clean_hf, work, file, model_type)
    code, _, err = run_cli(eval_argv(work, str(folder)), capsys)
    assert_refused_safely(work, code, err, f"{folder / file} {CODE}")
    assert "never runs code from a model folder" in err and "model-loader plugin (see docs/plugins.md)" in err


def test_a_y_on_stdin_runs_nothing(clean_hf, work):
    folder = custom_code_folder(clean_hf, work)
    proc = subprocess.run([str(CLI), *eval_argv(work, str(folder))], input="y\n" * 5, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert_refused_safely(work, proc.returncode, proc.stderr.strip(), CODE)
    assert "[y/N]" not in proc.stdout + proc.stderr


def test_the_loaders_refuse_custom_code_without_the_folder_check(clean_hf, work, capsys, monkeypatch):
    """Belt and braces: with the up-front check gone, trust_remote_code=False and no_prompts still refuse, though
    stdin says yes."""
    from clipcache.tasks.models import hf_loader, hf_model

    monkeypatch.setattr(hf_loader, "check_folder", lambda folder: None)
    monkeypatch.setattr(hf_model, "check_hf_source", lambda *a, **k: None)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 5))
    folder = custom_code_folder(clean_hf, work)
    code, _, err = run_cli(eval_argv(work, str(folder)), capsys)
    assert_refused_safely(work, code, err, "contains custom code")


def test_no_prompts_answers_eof():
    sys_stdin = sys.stdin
    try:
        sys.stdin = io.StringIO("y\n")
        with custom_code.no_prompts(), pytest.raises(EOFError):
            input("Do you wish to run the custom code? [y/N] ")
    finally:
        sys.stdin = sys_stdin


def st_folder(work: Path, modules_type: str) -> Path:
    folder = work / "st"
    folder.mkdir()
    (folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": modules_type}]))
    (folder / "evil_module.py").write_text(canary_payload(work / "canary") + "\nclass EvilModule:\n    pass\n")
    return folder


def test_sentence_transformers_folder_naming_its_own_module_is_refused(work, capsys, monkeypatch):
    folder = st_folder(work, "evil_module.EvilModule")
    monkeypatch.syspath_prepend(str(folder))  # even where the module could be imported by name
    beir = work / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "a red circle"}) + "\n")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "red"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    argv = eval_argv(work, str(folder), "--dataset", "mine", "--dataset_root", str(beir), "--task", "text_retrieval")
    code, _, err = run_cli(argv, capsys)
    assert_refused_safely(work, code, err, f"{folder / 'modules.json'} {CODE} (modules.json names the module "
                                           f"class 'evil_module.EvilModule', outside sentence-transformers)")
    # and sentence-transformers itself, called as clipcache calls it, refuses too
    from clipcache.tasks.models import st_model
    from clipcache.tasks.models.loader import ResolvedModel

    monkeypatch.setattr(st_model, "check_hf_source", lambda *a, **k: None)
    with pytest.raises(ModelError, match="not part of Sentence Transformers"):
        st_model.SentenceTransformerModel(ResolvedModel("sentence_transformers", str(folder), None, None, {}),
                                          torch.device("cpu"), False, None)
    assert not (work / "canary").exists()


def test_router_config_naming_a_foreign_class_is_refused(tmp_path):
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "router_config.json").write_text(json.dumps({"types": {"q": "mypkg.Evil"}}))
    with pytest.raises(ModelError, match="router_config.json asks to run its own Python code .*'mypkg.Evil'"):
        custom_code.check_folder(tmp_path)


def open_clip_folder(work: Path, text_cfg: dict) -> Path:
    folder = work / "oc"
    shutil.copytree(TINY_MODEL, folder)
    config = json.loads((folder / "open_clip_config.json").read_text())
    config["model_cfg"]["text_cfg"].update(text_cfg)
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    return folder


def test_open_clip_config_turning_trust_remote_code_on_is_refused(work, capsys):
    folder = open_clip_folder(work, {"hf_tokenizer_name": "x", "tokenizer_kwargs": {"trust_remote_code": True}})
    code, _, err = run_cli(eval_argv(work, f"local-dir:{folder}"), capsys)
    assert_refused_safely(work, code, err, f"{folder / 'open_clip_config.json'} {CODE} (text_cfg.tokenizer_kwargs "
                                           f"sets trust_remote_code)")


def test_open_clip_text_tower_naming_a_custom_code_folder_is_refused(clean_hf, work, capsys, monkeypatch):
    evil = custom_code_folder(clean_hf, work)
    folder = open_clip_folder(work, {"hf_model_name": str(evil), "hf_model_pretrained": False})
    code, _, err = run_cli(eval_argv(work, f"local-dir:{folder}"), capsys)
    assert_refused_safely(work, code, err, f"{evil / 'config.json'} {CODE}")
    # open_clip calls AutoConfig without trust_remote_code: without our check, the prompt it would show gets EOF
    from clipcache.tasks.models import open_clip_model

    monkeypatch.setattr(open_clip_model, "check_hf_source", lambda *a, **k: None)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 5))
    code, _, err = run_cli(eval_argv(work, f"local-dir:{folder}"), capsys)
    assert_refused_safely(work, code, err, "contains custom code")


# -- checkpoints --------------------------------------------------------------------------------------------------
def test_open_clip_checkpoint_with_a_pickle_payload_is_refused(work, capsys):
    folder = work / "oc"
    shutil.copytree(TINY_MODEL, folder)
    weights = load_file(folder / "open_clip_model.safetensors")
    (folder / "open_clip_model.safetensors").unlink()
    torch.save({**weights, "evil": Exec(canary_payload(work / "canary"))}, folder / "open_clip_pytorch_model.bin")
    code, _, err = run_cli(eval_argv(work, f"local-dir:{folder}"), capsys)
    assert_refused_safely(work, code, err, f"{folder}: refused to load 'exec' from a checkpoint pickle")


def test_hf_weights_with_a_pickle_payload_are_refused(clean_hf, work, capsys):
    folder = work / "hfbin"
    shutil.copytree(clean_hf, folder)
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save({**weights, "evil": Exec(canary_payload(work / "canary"))}, folder / "pytorch_model.bin")
    code, _, err = run_cli(eval_argv(work, str(folder)), capsys)
    assert_refused_safely(work, code, err, f"{folder}: refused to load 'exec' from a checkpoint pickle")


# -- dataset files ------------------------------------------------------------------------------------------------
def write_cifar10(root: Path, n: int = 8) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, file in enumerate(["test_batch", *(f"data_batch_{b}" for b in range(1, 6))]):
        batch = {"batch_label": file, "labels": [int(x) for x in rng.integers(0, 10, n)],
                 "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "filenames": [f"{i}_{j}.png" for j in
                                                                                       range(n)]}
        (folder / file).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)],
                                                        "num_cases_per_batch": n, "num_vis": 3072}, protocol=2))
    return root


@pytest.mark.parametrize("file", ["batches.meta", "test_batch"])
@pytest.mark.parametrize("payload", ["exec", "os.system"])
def test_cifar_pickle_with_a_payload_is_refused(work, capsys, file, payload):
    root = write_cifar10(work / "data")
    path = root / "cifar-10-batches-py" / file
    carrier = Exec(canary_payload(work / "canary")) if payload == "exec" else System(f"touch {work / 'canary'}")
    path.write_bytes(pickle.dumps({"label_names": carrier, "data": carrier}))
    refused = "builtins.exec" if payload == "exec" else f"{os.system.__module__}.system"
    code, _, err = run_cli(eval_argv(work, "tiny-shapes-clip", "--dataset", "cifar10", "--dataset_root", str(root)),
                           capsys)
    assert_refused_safely(work, code, err, f"{path}: refused to load {refused!r} from a pickle (clipcache loads "
                                           f"only NumPy arrays and plain containers from dataset pickles)")


def test_clean_cifar_pickles_still_load(work, capsys):
    root = write_cifar10(work / "data")
    code, _, err = run_cli(eval_argv(work, "tiny-shapes-clip", "--dataset", "cifar10", "--dataset_root", str(root)),
                           capsys)
    assert code == 0, err


def test_object_array_npy_in_a_wds_shard_is_refused(work, capsys):
    root = write_wds(work / "wds", "multilabel", 4, shards=1, n_classes=4)
    shard = root / "test" / "0.tar"
    buf = io.BytesIO()
    np.save(buf, np.array([Exec(canary_payload(work / "canary"))] * 4, dtype=object), allow_pickle=True)
    replace_tar_member(shard, "s000001.npy", buf.getvalue())
    code, _, err = run_cli(eval_argv(work, "tiny-shapes-clip", "--dataset", "wds/mine", "--dataset_root", str(root)),
                           capsys)
    assert_refused_safely(work, code, err, f"{shard} member s000001.npy: refused to load an object array from a "
                                           f".npy file")


def test_mnist_processed_file_with_a_payload_is_refused(work, capsys):
    processed = work / "data" / "MNIST" / "processed"
    processed.mkdir(parents=True)
    for file in ("training.pt", "test.pt"):
        (processed / file).write_bytes(pickle.dumps(Exec(canary_payload(work / "canary")), protocol=2))
    argv = eval_argv(work, "tiny-shapes-clip", "--dataset", "mnist", "--dataset_root", str(work / "data"))
    tree = Tree(work / "data")
    code, _, err = run_cli(argv, capsys)
    assert_refused_safely(work, code, err, "torchvision's MNIST refused to load 'exec' from a pickle")
    tree.assert_unchanged(work / "data")


# -- the restricted unpickler -------------------------------------------------------------------------------------
def cifar_batch() -> dict:
    return {"batch_label": "testing batch 1 of 1", "labels": [3, 8, 8], "filenames": ["a.png", "b.png", "c.png"],
            "data": np.arange(3 * 3072, dtype=np.int64).astype(np.uint8).reshape(3, 3072), "count": np.int64(3),
            "coarse": {1, 2}, "pair": (1.5, None, True)}


def assert_same_batch(loaded: dict, want: dict) -> None:
    assert loaded.keys() == want.keys()
    np.testing.assert_array_equal(loaded["data"], want["data"])
    assert loaded["data"].dtype == np.uint8
    assert {k: v for k, v in loaded.items() if k != "data"} == {k: v for k, v in want.items() if k != "data"}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_unpickler_admits_cifar_batches_at_every_protocol(protocol):
    want = cifar_batch()
    raw = pickle.dumps(want, protocol=protocol)
    assert_same_batch(DatasetUnpickler(io.BytesIO(raw), encoding="latin1").load(), want)
    if protocol <= 2:  # NumPy 1.x named its module numpy.core, as the original CIFAR files do
        legacy = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        assert_same_batch(DatasetUnpickler(io.BytesIO(legacy), encoding="latin1").load(), want)


class Python2Pickler(pickle._Pickler):  # type: ignore[name-defined]
    """Writes bytes as Python 2's cPickle wrote ``str`` (BINSTRING), and NumPy 1.x's module names: the form of the
    original CIFAR files, which torchvision reads with ``encoding="latin1"``."""

    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_bytes(self, obj):
        self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    def save_global(self, obj, name=None):
        if getattr(obj, "__module__", "") == "numpy._core.multiarray":
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n" + obj.__name__.encode() + b"\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)

    dispatch[bytes] = save_bytes


def test_unpickler_admits_a_python2_cifar_pickle(tmp_path):
    want = cifar_batch()
    buf = io.BytesIO()
    Python2Pickler(buf, protocol=2).dump(want)
    raw = buf.getvalue()
    assert b"_codecs" not in raw and b"numpy.core.multiarray" in raw
    (tmp_path / "batch").write_bytes(raw)
    assert_same_batch(load_dataset_pickle(tmp_path / "batch"), want)
    with open(tmp_path / "batch", "rb") as f:  # what torchvision does
        assert_same_batch(pickle.load(f, encoding="latin1"), want)


@pytest.mark.parametrize("carrier,refused", [
    (System("true"), f"{os.system.__module__}.system"),
    (Exec("pass"), "builtins.exec"),
    (type("P", (), {"__reduce__": lambda self: (subprocess.Popen, (["true"],))})(), "subprocess.Popen"),
    (__import__("functools").partial(print, "x"), "functools.partial"),
    (type("G", (), {"__reduce__": lambda self: (getattr, ("", "join"))})(), "builtins.getattr"),
    (type("E", (), {"__reduce__": lambda self: (eval, ("1",))})(), "builtins.eval"),
    (type("C", (), {"__reduce__": lambda self: (__import__("codecs").encode, ("x", "rot13"))})(),
     "_codecs.encode(..., 'rot13')"),
])
def test_unpickler_refuses_other_globals(tmp_path, carrier, refused):
    path = tmp_path / "batches.meta"
    path.write_bytes(pickle.dumps({"label_names": carrier}))
    with pytest.raises(DatasetError) as e:
        load_dataset_pickle(path)
    assert str(e.value) == (f"{path}: refused to load {refused!r} from a pickle (clipcache loads only NumPy arrays "
                            f"and plain containers from dataset pickles)")


def test_read_npy_admits_numbers_and_refuses_objects():
    buf = io.BytesIO()
    np.save(buf, np.array([0, 1, 1], dtype=np.uint8))
    np.testing.assert_array_equal(read_npy(buf.getvalue(), "m.npy"), [0, 1, 1])
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros(3))
    with pytest.raises(DatasetError, match="m.npy: not a .npy multi-hot vector"):
        read_npy(buf.getvalue(), "m.npy")
