"""Hosted datasets: download in both hub URL layouts from a local server, resume, integrity, offline, missing split,
and every catalog name resolving to a task and URLs."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hub_server import HubServer

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets import catalog, open_dataset
from clipcache.tasks.datasets.download import HubDataset, fetch_dataset, repo_name

from conftest import write_wds


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A served tree holding clip-benchmark/wds_vtab-cifar10 (classification, 3 shards)."""
    served = tmp_path / "served"
    write_wds(served / "clip-benchmark" / "wds_vtab-cifar10", "classification", 45, shards=3)
    with HubServer(served) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        yield server


@pytest.mark.parametrize("hub_name, revision", [("huggingface", "main"), ("modelscope", "master")])
def test_download_in_both_layouts_then_evaluate_offline(hub, tmp_path, hub_name, revision):
    ds = open_dataset("vtab_cifar10", None, "test", None, hub=hub_name, cache_dir=str(tmp_path / "cache"))
    assert len(ds) == 45 and ds.prompts is not None
    assert all(f"/resolve/{revision}/" in path for path, _ in hub.requests)
    served = open_dataset("wds/x", str(tmp_path / "served" / "clip-benchmark" / "wds_vtab-cifar10"), "test", None)
    np.testing.assert_array_equal(ds.labels, served.labels)
    hub.requests.clear()
    again = open_dataset("vtab_cifar10", None, "test", None, hub=hub_name, cache_dir=str(tmp_path / "cache"),
                         offline=True)
    assert len(again) == 45 and hub.requests == []
    # the clip_benchmark spelling reaches the same repository
    assert repo_name("wds/vtab/cifar10") == repo_name("vtab_cifar10") == "wds_vtab-cifar10"


def test_a_dropped_connection_resumes_with_a_range_request(hub, tmp_path):
    hub.drop_once.add("test/1.tar")
    with pytest.raises(DatasetError, match="run again to resume"):
        fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache", workers=1)
    part = tmp_path / "cache" / "datasets" / "huggingface" / "wds_vtab-cifar10" / "test" / "1.tar.part"
    assert part.exists() and part.stat().st_size > 0
    root = fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache", workers=1)
    assert any(path.endswith("test/1.tar") and rng == f"bytes={part_size}-"
               for path, rng in hub.requests for part_size in [rng and int(rng.split("=")[1][:-1])] if rng)
    served = tmp_path / "served" / "clip-benchmark" / "wds_vtab-cifar10" / "test" / "1.tar"
    assert (root / "test" / "1.tar").read_bytes() == served.read_bytes()


def test_corrupt_download_fails_its_checksum(hub, tmp_path):
    hub.corrupt.add("test/2.tar")
    with pytest.raises(DatasetError, match="corrupt: sha256"):
        fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache")
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
    with pytest.raises(DatasetError, match="download of http://127.0.0.1:9/.* failed"):
        fetch_dataset("vtab_cifar10", "test", "huggingface", tmp_path / "cache")


@pytest.mark.parametrize("name", sorted(catalog()))
def test_every_catalog_name_has_a_task_and_hub_urls(name, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("MODELSCOPE_ENDPOINT", raising=False)
    assert catalog()[name]["task"] in ("zeroshot_classification", "zeroshot_retrieval")
    hf, ms = HubDataset("huggingface", f"clip-benchmark/{repo_name(name)}"), \
        HubDataset("modelscope", f"clip-benchmark/{repo_name(name)}")
    assert hf.url("test/nshards.txt").startswith("https://huggingface.co/datasets/clip-benchmark/wds_")
    assert "/resolve/main/test/nshards.txt" in hf.url("test/nshards.txt")
    assert ms.url("test/0.tar").startswith("https://www.modelscope.cn/datasets/clip-benchmark/wds_")
    assert "/resolve/master/test/0.tar" in ms.url("test/0.tar")


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
    from clipcache.flows.cli_catalog import markdown_table

    from conftest import REPO

    assert markdown_table() in (REPO / "README.md").read_text()
