"""``--model_type internvl`` with ``--pretrained`` a hub repository id (``ORG/NAME`` or ``hf-hub:ORG/NAME``) and
``--trust_remote_code``: the repository is downloaded by huggingface_hub's real ``snapshot_download`` from a local
stand-in of the Hugging Face hub on 127.0.0.1 (tests/hub_server.py) into the model cache, then read from that cache
offline (HF_HUB_OFFLINE), and evaluated exactly as a local folder with the same files: the same identity (content and
code hashes), experiment and numbers. Without the opt-in nothing is downloaded; a changed code file on the hub is a
new commit and a new experiment; offline with nothing cached is one line."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from hub_server import HubServer
from internvl_fixtures import make_internvl_folder
from layout_fixtures import write_mnist

from clipcache.storage.errors import ModelError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

from hostile import assert_refused, run_cli

REPO = "OpenGVLab/InternVL-14B-224px"
# The seed's MNIST command (InternVL's clip_benchmark README) with --pretrained naming the hub repository.
SEED = ('eval --model_type internvl --language "en" --task "zeroshot_classification" --dataset "mnist" '
        '--dataset_root ./data/ --model internvl_c_classification --pretrained {folder} --output result.json')


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("internvl_hub")
    make_internvl_folder(root / "served" / REPO)
    write_mnist(root / "data")
    return root


@pytest.fixture
def hub(served, tmp_path, monkeypatch):
    """The hub stand-in serving the tiny InternVL repository (a fresh copy per test); online through HF_ENDPOINT."""
    import huggingface_hub.constants

    shutil.copytree(served / "served", tmp_path / "served")
    (tmp_path / "data").symlink_to(served / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # conftest sets it; 127.0.0.1 only
    with HubServer(tmp_path / "served") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def run_seed(capsys, folder: str, *extra: str) -> dict:
    Path("result.json").unlink(missing_ok=True)
    code, _, err = run_cli([*shlex.split(SEED.format(folder=folder)), "--model_cache_dir", "hf", "--output_dir",
                            "out", *extra, "--quiet", "--orchestrator", "local"], capsys)
    assert code == 0, err
    result = json.loads(Path("result.json").read_text())
    experiments = [json.loads(p.read_text())["experiment"] for p in Path("out").rglob("mnist_*.json")]
    result["experiment_ids"] = {e["id"] for e in experiments}
    return result


def test_without_the_opt_in_nothing_is_downloaded(hub, capsys):
    code, _, err = run_cli(shlex.split(SEED.format(folder=REPO)) + ["--model_cache_dir", "hf", "--quiet",
                                                                   "--orchestrator", "local"], capsys)
    assert_refused(code, err, f"{REPO} asks to run its own Python code")
    assert "--trust_remote_code" in err and hub.requests == [] and hub.heads == [] and not Path("hf").exists()


def test_downloaded_then_offline_equals_the_local_folder(hub, capsys, monkeypatch):
    import huggingface_hub.constants

    downloaded = run_seed(capsys, REPO, "--trust_remote_code")
    assert any(path.startswith(f"/api/models/{REPO}/") for path, _ in hub.requests)
    assert any(path.startswith(f"/{REPO}/resolve/") for path, _ in hub.requests)
    snapshots = list(Path("hf").glob("models--OpenGVLab--InternVL-14B-224px/snapshots/*/modeling_internvl.py"))
    assert len(snapshots) == 1
    # the same files as a local folder: one model, one experiment, the same numbers
    local = run_seed(capsys, f"./served/{REPO}", "--trust_remote_code")
    assert local["metrics"] == downloaded["metrics"] and local["experiment_ids"] == downloaded["experiment_ids"]
    # offline: from the cache, nothing asked of the hub; hf-hub: names the same repository
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub.requests.clear()
    hub.heads.clear()
    offline = run_seed(capsys, f"hf-hub:{REPO}", "--trust_remote_code")
    assert offline["metrics"] == downloaded["metrics"] and offline["experiment_ids"] == downloaded["experiment_ids"]
    assert hub.requests == [] and hub.heads == []
    memo = FileHashMemo(None)
    resolved = resolve_model(ModelSpec(model_name="internvl_c_classification", pretrained=REPO, model_type="internvl",
                                       trust_remote_code=True), memo, "hf")
    assert resolved.identity["trust_remote_code"] is True
    assert set(resolved.identity["code_files"]) == {"configuration_internvl.py", "modeling_internvl.py"}
    assert resolved.checkpoint_label.startswith("InternVL-14B-224px@")
    assert resolved.revision == snapshots[0].parent.name  # the commit the files came from


def test_a_changed_code_file_on_the_hub_is_a_new_experiment(hub, capsys):
    first = run_seed(capsys, REPO, "--trust_remote_code")
    code = Path("served") / REPO / "modeling_internvl.py"
    code.write_text(code.read_text() + "\n# a new commit: same behaviour, another file\n")
    second = run_seed(capsys, REPO, "--trust_remote_code")
    assert second["metrics"] == first["metrics"]
    assert len(first["experiment_ids"]) == 1 and second["experiment_ids"] > first["experiment_ids"]  # a second one
    assert len(list(Path("hf").glob("models--OpenGVLab--InternVL-14B-224px/snapshots/*"))) == 2


def test_offline_with_nothing_cached_is_one_line(hub, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code, _, err = run_cli(shlex.split(SEED.format(folder=REPO)) + ["--trust_remote_code", "--model_cache_dir", "hf",
                                                                   "--quiet", "--orchestrator", "local"], capsys)
    assert_refused(code, err, f"could not get {REPO} from the Hugging Face hub or its local cache")
    assert hub.requests == []
    with pytest.raises(ModelError, match="from the Hugging Face hub only"):
        resolve_model(ModelSpec(model_name="internvl_c_classification", pretrained=REPO, hub="modelscope",
                                model_type="internvl", trust_remote_code=True), FileHashMemo(None))
    with pytest.raises(ModelError, match="not a Hugging Face repository id"):
        resolve_model(ModelSpec(model_name="internvl_c_classification", pretrained="hf-hub:no-slash",
                                model_type="internvl", trust_remote_code=True), FileHashMemo(None))
