"""Hosted datasets: downloaded through huggingface_hub and modelscope from a local server (both hubs' protocols),
tokens, resume, integrity, offline, missing split, and every catalog name resolving to a task and URLs."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hub_server import HubServer

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets import catalog, open_dataset
from clipcache.tasks.datasets.clip_benchmark.download import HubDataset, fetch_dataset, repo_name

from conftest import write_wds


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A served tree holding clip-benchmark/wds_vtab-cifar10 (classification, 3 shards)."""
    served = tmp_path / "served"
    write_wds(served / "clip-benchmark" / "wds_vtab-cifar10", "classification", 45, shards=3)
    import huggingface_hub.constants

    # conftest puts huggingface_hub offline; these tests talk to 127.0.0.1 only, through the endpoint variables
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with HubServer(served) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        yield server


@pytest.mark.parametrize("hub_name, route", [("huggingface", "/datasets/clip-benchmark/wds_vtab-cifar10/resolve/main/"),
                                             ("modelscope", "/api/v1/datasets/clip-benchmark/wds_vtab-cifar10/repo?")])
def test_download_through_each_hubs_client_then_evaluate_offline(hub, tmp_path, monkeypatch, hub_name, route):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms_test_token")
    ds = open_dataset("vtab_cifar10", None, "test", None, hub=hub_name, cache_dir=str(tmp_path / "cache"))
    assert len(ds) == 45 and ds.prompts is not None
    files = [path for path, _ in hub.requests if path != "/api/v1/repos/internalAccelerationInfo"]  # modelscope asks
    assert files and all(path.startswith(route) for path in files)  # the mirror, in its hub's protocol
    token = "hf_test_token" if hub_name == "huggingface" else "ms_test_token"
    assert all(auth == f"Bearer {token}"  # the hub's token reached it with every file request
               for (path, _), auth in zip(hub.requests, hub.authorizations, strict=True) if path in files)
    root = tmp_path / "cache" / "datasets" / hub_name / "wds_vtab-cifar10"
    assert not [p for p in root.rglob("*") if p.name.endswith((".incomplete", ".part"))]
    assert token not in "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())
    served = open_dataset("wds/x", str(tmp_path / "served" / "clip-benchmark" / "wds_vtab-cifar10"), "test", None)
    np.testing.assert_array_equal(ds.labels, served.labels)
    hub.requests.clear()
    again = open_dataset("vtab_cifar10", None, "test", None, hub=hub_name, cache_dir=str(tmp_path / "cache"),
                         offline=True)
    assert len(again) == 45 and hub.requests == []
    # the clip_benchmark spelling reaches the same repository
    assert repo_name("wds/vtab/cifar10") == repo_name("vtab_cifar10") == "wds_vtab-cifar10"


@pytest.mark.parametrize("hub_name", ["huggingface", "modelscope"])
def test_a_dropped_connection_resumes_with_a_range_request(hub, tmp_path, monkeypatch, hub_name):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # it keeps whole chunks (10 MB)
    hub.drop_once.add("test/1.tar")
    served = tmp_path / "served" / "clip-benchmark" / "wds_vtab-cifar10" / "test" / "1.tar"
    try:  # the client retries by itself; if it gives up, the next run resumes
        root = fetch_dataset("vtab_cifar10", "test", hub_name, tmp_path / "cache", workers=1)
    except DatasetError as e:
        assert "run again to resume" in str(e)
        root = fetch_dataset("vtab_cifar10", "test", hub_name, tmp_path / "cache", workers=1)
    tail = [rng for path, rng in hub.requests if "1.tar" in path and rng and not rng.startswith("bytes=0-")]
    assert tail, hub.requests  # the second request asked only for what was missing
    assert (root / "test" / "1.tar").read_bytes() == served.read_bytes()


def test_corrupt_download_fails_its_checksum(hub, tmp_path):
    hub.corrupt.add("test/2.tar")
    with pytest.raises(DatasetError, match="corrupt: sha256 .* removed, run again"):
        fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache")
    assert not (tmp_path / "cache" / "datasets" / "huggingface" / "wds_vtab-cifar10" / "test" / "2.tar").exists()
    hub.corrupt.clear()
    root = fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache")
    assert len(open_dataset("wds/x", str(root), "test", None)) == 45


def test_missing_split_offline_and_unreachable(hub, tmp_path, monkeypatch):
    fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache")
    with pytest.raises(DatasetError, match="has no split 'valid' on huggingface; available splits: test"):
        fetch_dataset("vtab_cifar10", "valid", "huggingface", tmp_path / "cache")
    with pytest.raises(DatasetError, match="not in the cache .* --offline"):
        fetch_dataset("cars", "test", "huggingface", tmp_path / "cache", offline=True)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    shutil.rmtree(tmp_path / "cache")
    waits = []
    monkeypatch.setattr("time.sleep", waits.append)  # huggingface_hub backs off 1, 2, 4, 8, 8 s between tries
    with pytest.raises(DatasetError, match="download of http://127.0.0.1:9/.* failed: ConnectError: .*run again"):
        fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache")
    assert len(waits) >= 3  # it retried before giving up


@pytest.mark.parametrize("name", sorted(catalog()))
def test_every_catalog_name_has_a_task_and_hub_urls(name, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("MODELSCOPE_ENDPOINT", raising=False)
    assert catalog()[name]["task"] in ("zeroshot_classification", "zeroshot_retrieval")
    hf, ms = HubDataset("huggingface", f"clip-benchmark/{repo_name(name)}"), \
        HubDataset("modelscope", f"clip-benchmark/{repo_name(name)}")
    assert hf.url("test/nshards.txt").startswith("https://huggingface.co/datasets/clip-benchmark/wds_")
    assert "/resolve/main/test/nshards.txt" in hf.url("test/nshards.txt")
    assert ms.url("test/0.tar").startswith("https://www.modelscope.cn/api/v1/datasets/clip-benchmark/wds_")
    assert ms.url("test/0.tar").endswith("/repo?Revision=master&FilePath=test/0.tar")


def test_eval_downloads_a_catalog_dataset_by_name(prefect_server, hub, tmp_path, capsys):
    from clipcache.flows.cli import main

    args = ["eval", "--model", "tiny-shapes-clip", "--dataset", "vtab_cifar10", "--limit", "20", "--quiet",
            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    assert main(args) == 0
    assert (tmp_path / "out" / "tiny-shapes-clip" / "vtab_cifar10_zeroshot_classification.limit20.json").exists()
    assert main([*args, "--offline"]) == 0 and "cache hit" in capsys.readouterr().out


def test_datasets_and_models_commands(hub, tmp_path, capsys):
    from clipcache.flows.cli import main

    fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache")
    assert main(["datasets", "--cache_dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if "vtab_cifar10 " in row)
    assert "wds_vtab-cifar10" in line and " test " in line and "KB" in line
    assert main(["models", "--filter", "chinese"]) == 0
    assert "AI-ModelScope/chinese-clip-vit-large-patch14-336px" in capsys.readouterr().out


def test_readme_catalog_table_is_generated_from_the_catalog():
    from clipcache.flows.cli.catalog import markdown_table

    from conftest import REPO

    assert markdown_table() in (REPO / "README.md").read_text()
