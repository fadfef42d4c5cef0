"""Shared fixtures: real data in real formats, real tiny models, one Prefect test server per session.

No test talks to any host but 127.0.0.1: hub clients are forced offline and pointed at a closed local port.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

# Before anything imports huggingface_hub / modelscope / prefect.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["MODELSCOPE_DOMAIN"] = "127.0.0.1:9"
os.environ["MODELSCOPE_ENDPOINT"] = "http://127.0.0.1:9"
# modelscope_hub retries a failed repo listing 4 times with a 1, 2, 4 s back-off (its documented setting): against
# the closed port above, one attempt fails the same way, with the same error, 7 s sooner.
os.environ["MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS"] = "1"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL")
# One intra-op thread per test process and per CLI it starts (before torch or NumPy is imported): `make test` runs one
# pytest worker per core (pytest-xdist), and the tiny models' small matrices gain nothing from a second thread that
# would compete with the other worker (measured under contention: 4x the CPU time for the same text encodes). Tests
# of the multi-threaded paths set their thread count themselves.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = REPO / "tasks" / "models" / "assets" / "tiny-shapes-clip"


@pytest.fixture(scope="session", autouse=True)
def _prefect_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    yield home


@pytest.fixture(scope="session")
def prefect_server(_prefect_home):
    """A real Prefect API (SQLite, in-process) shared by every test that runs a flow in this process."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def image_bytes(image, fmt: str) -> bytes:
    buf = io.BytesIO()
    options = {"webp": {"format": "WEBP", "lossless": True}, "png": {"format": "PNG"},
               "jpg": {"format": "JPEG", "quality": 95}, "jpeg": {"format": "JPEG", "quality": 95}}[fmt]
    image.save(buf, **options)
    return buf.getvalue()


def write_wds(root: Path, kind: str, n: int, shards: int = 2, split: str = "test", fmt: str = "webp",
              n_classes: int = 30, seed: int = 0) -> Path:
    """A dataset in the hosted clip_benchmark webdataset layout, written with the real ``webdataset`` library.

    Images are shapes test images; ``kind``: classification (``.cls``), retrieval (``.txt``, 1-3 captions),
    multilabel (``.npy`` multi-hot).
    """
    import webdataset as wds

    from clipcache.tasks.datasets import shapes

    retrieval = kind == "retrieval"
    ds = shapes.load_shapes("fixture", "zeroshot_retrieval" if retrieval else "zeroshot_classification", "test", n)
    (root / split).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_shard = -(-n // shards)
    for s in range(shards):
        with wds.TarWriter(str(root / split / f"{s}.tar")) as sink:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                sample = {"__key__": f"s{i:06d}", fmt: image_bytes(ds.load_image(i), fmt)}
                if retrieval:
                    sample["txt"] = "\n".join(ds.captions[i])
                elif kind == "multilabel":
                    hot = (rng.random(n_classes) < 0.2).astype(np.uint8)
                    hot[int(ds.labels[i]) % n_classes] = 1
                    buf = io.BytesIO()
                    np.save(buf, hot)
                    sample["npy"] = buf.getvalue()
                else:
                    sample["cls"] = str(int(ds.labels[i]) % n_classes)
                sink.write(sample)
    (root / split / "nshards.txt").write_text(f"{shards}\n")
    if retrieval:
        (root / "dataset_type.txt").write_text("retrieval\n")
    else:
        if kind == "multilabel":
            (root / "dataset_type.txt").write_text("multilabel\n")
        names = shapes.CLASSNAMES[:n_classes]
        (root / "classnames.txt").write_text("\n".join(names) + "\n")
        (root / "zeroshot_classification_templates.txt").write_text("\n".join(shapes.TEMPLATES) + "\n")
    return root


def replace_tar_member(shard: Path, member: str, data: bytes) -> None:
    """Rewrite a shard with one member's bytes replaced (to make a corrupt image)."""
    import tarfile

    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w") as tar:
        for m, content in members:
            if m.name == member:
                content = data
                m.size = len(data)
            tar.addfile(m, io.BytesIO(content))


def write_image_queries(root: Path, n: int = 12, relative_to: str = "file") -> Path:
    """evalscope's custom retrieval layout: images on disk + image_queries.jsonl."""
    from clipcache.tasks.datasets import shapes

    ds = shapes.load_shapes("fixture", "zeroshot_retrieval", "test", n)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    data_dir = root / "text-image-retrieval"
    data_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        path = images / f"img{i}.png"
        ds.load_image(i).save(path)
        ref = os.path.relpath(path, data_dir) if relative_to == "file" else str(path)
        lines.append(json.dumps({"image_path": ref, "query": ds.captions[i]}))
    (data_dir / "image_queries.jsonl").write_text("\n".join(lines) + "\n")
    return data_dir


def perturbed_tiny_model(dst: Path, spread: float = 0.35) -> Path:
    """A copy of the bundled model with seeded noise (``spread`` x each matrix's std) on its image tower's weight
    matrices: a second checkpoint that is measurably worse, for comparing checkpoints."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(TINY_MODEL, dst)
    weights = load_file(dst / "open_clip_model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, value in weights.items():
        if value.is_floating_point() and "visual" in name and value.ndim == 2:
            noise = spread * value.float().std() * torch.randn(value.shape, generator=generator)
            weights[name] = (value.float() + noise).to(value.dtype)
    save_file(weights, dst / "open_clip_model.safetensors")
    return dst


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    assert (TINY_MODEL / "open_clip_config.json").exists(), "bundled model missing; run scripts/train_tiny_model.py"
    return TINY_MODEL


@pytest.fixture(scope="session")
def wds_classification(tmp_path_factory) -> Path:
    return write_wds(tmp_path_factory.mktemp("wds") / "shapes_cls", "classification", 90, shards=3)


@pytest.fixture(scope="session")
def wds_retrieval(tmp_path_factory) -> Path:
    return write_wds(tmp_path_factory.mktemp("wds") / "shapes_ret", "retrieval", 60, shards=2, fmt="png")


@pytest.fixture(scope="session")
def wds_multilabel(tmp_path_factory) -> Path:
    return write_wds(tmp_path_factory.mktemp("wds") / "shapes_ml", "multilabel", 40, shards=1, fmt="jpg")


# The fast tier (`make test-fast`) leaves out what needs a Prefect server, other processes, servers or a browser.
FULL_TIER_FIXTURES = {"prefect_server", "s3_endpoint", "bucket", "hub", "vlm", "embedding_server"}
FULL_TIER_MODULES = {"test_deployments", "test_scaleout", "test_remote_storage", "test_artifacts", "test_packaging"}


# `make test` hands whole files to its pytest workers (--dist loadfile) in the order collected here, and its
# --no-loadscope-reorder keeps that order: these files first, heaviest first (the slowest files of a full run with
# --durations, where each one's tests and module fixtures take 30 s to a few minutes), then the rest by number of
# tests, most first, as xdist orders them itself. Otherwise xdist's own order (by number of tests) leaves these
# files, which hold few tests, for the end, where one of them can keep a worker busy alone while the other is idle.
# Longest first, the run ends on small files and the workers finish together. A file missing here only runs later.
HEAVY_FILES_FIRST = ("test_faults", "test_wheel", "test_store_errors", "test_deployments", "test_launch",
                     "test_scaleout", "test_cache",
                     "test_faults_prefect", "test_suite_reports", "test_remote_storage", "test_plugins",
                     "test_plugin_sources", "test_captioning", "test_experiments", "test_original_layouts",
                     "test_bundled_model", "test_compare", "test_group_marts")


def _module_name(item) -> str:
    return item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if (fixtures & FULL_TIER_FIXTURES or item.get_closest_marker("slow") is not None
                or item.module.__name__.rsplit(".", 1)[-1] in FULL_TIER_MODULES):
            item.add_marker(pytest.mark.full)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the order the controller schedules files in
        sizes: dict[str, int] = {}
        for item in items:
            sizes[_module_name(item)] = sizes.get(_module_name(item), 0) + 1
        rank = {name: i for i, name in enumerate(HEAVY_FILES_FIRST)}
        items.sort(key=lambda item: (rank.get(_module_name(item), len(rank)), -sizes[_module_name(item)],
                                     _module_name(item)))  # stable: a file's tests keep their order


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 HTTP API (moto's server) on 127.0.0.1; clients find it through AWS_ENDPOINT_URL, as users would.
    One for the whole session: s3fs caches its file systems per process, endpoint included, so a second server
    would be invisible to clients made for the first (each test makes its own bucket)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {}
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    import os

    for name, value in env.items():
        saved[name] = os.environ.get(name)
        os.environ[name] = value
    yield endpoint
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    server.stop()


@pytest.fixture
def bucket(s3_endpoint):
    import uuid

    import boto3

    name = f"clipcache-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name
