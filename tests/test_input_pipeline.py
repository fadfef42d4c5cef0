"""The input pipeline (issue #30): decoding processes give the vectors threads give, bit for bit, in order; bad images,
a killed worker, a failing cache writer and --decode gpu without CUDA each end in one clear line."""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from clipcache.storage.cache_keys import entry_key
from clipcache.storage.cache_writer import EntryWriter
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.contract import EncodeSettings
from clipcache.tasks.datasets.labelled import load_imagefolder
from clipcache.tasks.datasets.shapes import load_shapes
from clipcache.tasks.encode.batches import iter_image_batches
from clipcache.tasks.encode.decode_pool import DecodeWorkerError, acquire_pool, release_pool
from clipcache.tasks.encode.overlap import BackgroundWriter, PendingVectors
from clipcache.tasks.encode.preprocess import lower, portable_transform
from clipcache.tasks.encode.stage import ModelSession, encode_images, image_key_fields
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.progress import StageProgress

from conftest import REPO, image_bytes, replace_tar_member, write_wds
from pipeline_helpers import DiesAt, SlowFirstBatch

QUIET = StageProgress(enabled=False)


@pytest.fixture(scope="module")
def session():
    s = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)), torch.device("cpu"),
                     False, "fp32")
    _ = s.model
    return s


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    """An imagefolder of 500x375 / 375x500 JPEGs (odd sizes, so resize and crop do real work)."""
    root = tmp_path_factory.mktemp("jpegs")
    shapes = load_shapes("x", "zeroshot_classification", "test", 90)
    for i in range(90):
        folder = root / f"class{i % 3}"
        folder.mkdir(exist_ok=True)
        size = (500, 375) if i % 2 else (375, 500)
        shapes.load_image(i).resize(size, Image.BILINEAR).save(folder / f"{i:03d}.jpg", quality=90)
    return root


def encode(session, dataset, cache: Path, **settings):
    store = EmbeddingStore(cache)
    fields = image_key_fields(session, dataset.identity(FileHashMemo(None)), dataset.split, None)
    outcome = encode_images(session, dataset, store, fields, EncodeSettings(**{"batch_size": 16, **settings}), QUIET)
    entry = store.open(outcome.ref.key)
    return outcome, entry.embeddings(), np.asarray(entry.array("position"))


def test_lowered_preprocessing_equals_torchvision_to_the_bit():
    from open_clip.transform import image_transform

    transform = image_transform(224, is_train=False)
    lowered = lower(transform)
    assert lowered is not None
    rng = np.random.default_rng(0)
    for size in [(500, 375), (375, 500), (224, 224), (100, 50), (999, 1000), (7, 300)]:  # (100, 50): padded crop
        raw = image_bytes(Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)), "jpg")
        image = Image.open(io.BytesIO(raw)).convert("RGB")
        expected, got = transform(image).numpy(), lowered(image)
        assert got.dtype == expected.dtype and np.array_equal(got.view(np.uint32), expected.view(np.uint32)), size


def test_processes_give_the_threads_vectors_bit_for_bit(session, jpeg_folder, tmp_path):
    shapes = load_shapes("shapes", "zeroshot_classification", "test", 100)
    folder = load_imagefolder("jpegs", jpeg_folder, "test", None)
    wds = write_wds(tmp_path / "wds", "classification", 40, fmt="jpg")
    from clipcache.tasks.datasets import open_dataset

    shards = open_dataset("wds/jpegs", str(wds), "test", None)
    for name, dataset in (("shapes", shapes), ("folder", folder), ("wds", shards)):
        _, threads, _ = encode(session, dataset, tmp_path / f"{name}-t", num_workers=2, decode_pool="threads")
        outcome, processes, positions = encode(session, dataset, tmp_path / f"{name}-p", num_workers=2,
                                               decode_pool="processes")
        assert outcome.encoded == len(dataset) and positions.tolist() == list(range(len(dataset)))
        assert np.array_equal(threads.view(np.uint32), processes.view(np.uint32)), name


def test_batches_come_in_dataset_order_whoever_finishes_first(session):
    dataset = SlowFirstBatch(**vars(load_shapes("slow", "zeroshot_classification", "test", 53)), slow=7)
    transform = portable_transform(session.model)
    seen, pixels = [], []
    for batch in iter_image_batches(dataset, session.model.image_transform, 3, 7, 3, pool="processes",
                                    portable=transform):
        seen += batch.indices.tolist()
        pixels.append(batch.pixels.clone())  # the slot is reused after this batch
    assert seen == list(range(3, 53))
    expected = torch.stack([session.model.image_transform(dataset.load_image(i)) for i in range(3, 53)])
    assert torch.equal(torch.cat(pixels), expected)


def test_bad_images_are_one_named_line_or_skipped(session, tmp_path):
    root = write_wds(tmp_path / "wds", "classification", 30, fmt="jpg")
    replace_tar_member(root / "test" / "0.tar", "s000004.jpg", b"not a jpeg")
    from clipcache.tasks.datasets import open_dataset

    dataset = open_dataset("wds/bad", str(root), "test", None)
    with pytest.raises(DatasetError) as error:
        encode(session, dataset, tmp_path / "c1", num_workers=2, decode_pool="processes")
    assert "0.tar member s000004.jpg" in str(error.value) and "--on_bad_image skip" in str(error.value)
    assert "\n" not in str(error.value)
    _, skipped, positions = encode(session, dataset, tmp_path / "c2", num_workers=2, decode_pool="processes",
                                   on_bad_image="skip")
    _, threads, _ = encode(session, dataset, tmp_path / "c3", num_workers=2, decode_pool="threads",
                           on_bad_image="skip")
    assert 4 not in positions.tolist() and len(positions) == 29 and np.array_equal(skipped, threads)


def test_a_killed_worker_is_one_line_and_no_hang(session):
    dataset = DiesAt(**vars(load_shapes("dies", "zeroshot_classification", "test", 200)), fatal=70)
    transform = portable_transform(session.model)
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            for _ in iter_image_batches(dataset, session.model.image_transform, 0, 16, 2, pool="processes",
                                        portable=transform):
                pass
        except BaseException as e:  # noqa: BLE001 (handed to the test thread)
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the encode hung after its worker died"
    error = outcome["error"]
    assert isinstance(error, DecodeWorkerError), error
    message = str(error)
    assert "\n" not in message and "killed by SIGKILL" in message and "images 64..79 of dies" in message
    # the broken pool is gone; the next encode starts a fresh one
    pool = acquire_pool(2)
    assert pool is not None and pool.alive()
    release_pool(pool)


def test_workers_import_neither_prefect_nor_torch(session):
    import prefect  # noqa: F401  (the parent has it, as inside a flow run)

    shapes = load_shapes("shapes", "zeroshot_classification", "test", 20)
    for _ in iter_image_batches(shapes, session.model.image_transform, 0, 8, 2, pool="processes",
                                portable=portable_transform(session.model)):
        pass
    pool = acquire_pool(2)
    try:
        for modules in pool.ping():
            assert "prefect" not in modules and "torch" not in modules and "torchvision" not in modules
    finally:
        release_pool(pool)


def test_a_failing_cache_write_fails_the_run_and_keeps_committed_rows(session, tmp_path, monkeypatch):
    monkeypatch.setenv("CLIPCACHE_CHUNK_ROWS", "16")
    dataset = load_shapes("shapes", "zeroshot_classification", "test", 80)
    commit = EntryWriter._commit
    calls = []

    def full_disk(self, everything):
        calls.append(everything)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        commit(self, everything)

    monkeypatch.setattr(EntryWriter, "_commit", full_disk)
    with pytest.raises(OSError, match="No space left"):
        encode(session, dataset, tmp_path / "c", num_workers=2, decode_pool="processes")
    monkeypatch.setattr(EntryWriter, "_commit", commit)
    resumed, vectors, _ = encode(session, dataset, tmp_path / "c", num_workers=2, decode_pool="processes")
    assert resumed.resumed and resumed.encoded == 80 - 32  # two chunks of 16 were committed before the failure
    _, clean, _ = encode(session, dataset, tmp_path / "clean", num_workers=0)
    assert np.array_equal(vectors, clean)


def test_the_writer_threads_error_is_raised_in_the_encoding_thread():
    class Broken:
        def add(self, *args, **kwargs):
            raise ValueError("chunk write failed")

    with pytest.raises(ValueError, match="chunk write failed"):
        with BackgroundWriter(Broken(), depth=1) as sink:
            for _ in range(10):  # the queue is full after one: the failure must surface, not block
                sink.add(PendingVectors(np.zeros((2, 4), dtype=np.float32)), np.arange(2))


def test_decode_gpu_without_cuda_is_refused_in_one_line(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from clipcache.flows.cli import main

    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--decode", "gpu", "--limit", "8",
                 "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--decode gpu" in err and "CUDA" in err and len(err.splitlines()) == 1, err
    assert not [p for d in ("cache", "out") if (tmp_path / d).exists() for p in (tmp_path / d).rglob("*")]


def test_the_decode_mode_enters_identity_only_when_not_the_default(session):
    from clipcache.tasks.evaluation import get_task
    from clipcache.tasks.identity import decode_option

    fields = image_key_fields(session, {"content": "x"}, "test", None)
    assert "decode" not in fields
    assert entry_key(fields) == entry_key({"role": "image", "model": session.resolved.identity, "precision": "fp32",
                                           "dataset": {"content": "x"}, "split": "test", "limit": None})
    gpu = image_key_fields(replace(session, decode="gpu"), {"content": "x"}, "test", None)
    assert gpu["decode"] == "gpu" and entry_key(gpu) != entry_key(fields)
    classification = get_task("zeroshot_classification")
    assert decode_option("cpu", classification) == {}
    assert decode_option("gpu", classification) == {"decode": "gpu"}
    for name in ("any2any_retrieval", "visual_sts", "multiple_choice"):  # their image roles have other names
        assert decode_option("gpu", get_task(name)) == {"decode": "gpu"}
    assert decode_option("gpu", get_task("text_retrieval")) == {}  # no image is decoded


def test_device_preprocessing_runs_and_stays_close_to_pil(session, jpeg_folder):
    """The --decode gpu code path, run here on the CPU (libjpeg instead of nvJPEG): same shapes, close pixels."""
    from clipcache.tasks.encode.gpu_decode import gpu_batches

    folder = load_imagefolder("jpegs", jpeg_folder, "test", 20)
    batches = list(gpu_batches(folder, session.model, 0, 8, 2, device=torch.device("cpu")))
    assert [b.indices.tolist() for b in batches] == [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    pil = torch.stack([session.model.image_transform(folder.load_image(i)) for i in range(20)])
    device = torch.cat([b.pixels for b in batches])
    assert device.shape == pil.shape
    assert (device - pil).abs().mean() < 0.05  # torch's bicubic is not PIL's; the difference is small


CTRL_C_SCRIPT = """
import sys, time
from clipcache.tasks.datasets.shapes import load_shapes
from clipcache.tasks.encode import decode_pool
from clipcache.tasks.encode.batches import iter_image_batches
from clipcache.tasks.encode.preprocess import Preprocess, ToFloatArray
from pipeline_helpers import SlowFirstBatch

dataset = SlowFirstBatch(**vars(load_shapes("s", "zeroshot_classification", "test", 4000)), slow=4000)
for batch in iter_image_batches(dataset, None, 0, 16, 2, pool="processes", portable=Preprocess((ToFloatArray(),))):
    print(*[w.proc.pid for w in decode_pool._shared.workers], flush=True)
    time.sleep(0.2)
"""


def test_ctrl_c_stops_the_workers():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(workers) == 2, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in err
    for pid in workers:
        with pytest.raises(ProcessLookupError):  # exited and reaped by the interrupted process
            os.kill(pid, 0)


def test_a_dataset_class_importable_only_after_the_pool_started_still_decodes(session, tmp_path, monkeypatch):
    """The workers start once per process with the import path of that moment; a reader imported later (a plugin, a
    folder added to sys.path since) is sent its path with the job, so the worker can unpickle it."""
    pool = acquire_pool(2)  # started (or already running) before the module below exists anywhere on the path
    release_pool(pool)
    (tmp_path / "late_reader_module.py").write_text(
        "from clipcache.tasks.datasets.shapes import ShapesDataset\n\n"
        "class LateShapes(ShapesDataset):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from late_reader_module import LateShapes

    dataset = LateShapes(**vars(load_shapes("late", "zeroshot_classification", "test", 20)))
    indices = []
    for batch in iter_image_batches(dataset, session.model.image_transform, 0, 8, 2, pool="processes",
                                    portable=portable_transform(session.model)):
        indices += batch.indices.tolist()
    assert indices == list(range(20))
    sys.modules.pop("late_reader_module", None)


def test_a_dataset_class_no_worker_can_import_decodes_in_threads(session, monkeypatch):
    """A reader defined in a notebook's ``__main__`` or a module built in memory (docs/extending.md's examples run so)
    cannot be unpickled by a worker process: its images decode in threads instead of failing."""
    import types

    pool = acquire_pool(2)  # a running pool would otherwise be used for any size of dataset
    release_pool(pool)
    module = types.ModuleType("in_memory_reader")
    exec("from clipcache.tasks.datasets.shapes import ShapesDataset\n\nclass MemoryShapes(ShapesDataset):\n    pass\n",
         module.__dict__)
    monkeypatch.setitem(sys.modules, "in_memory_reader", module)
    dataset = module.MemoryShapes(**vars(load_shapes("memory", "zeroshot_classification", "test", 20)))
    indices = []
    for batch in iter_image_batches(dataset, session.model.image_transform, 0, 8, 2, pool="processes",
                                    portable=portable_transform(session.model)):
        indices += batch.indices.tolist()
    assert indices == list(range(20))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")


@pytest.fixture(scope="module")
def cuda_session():
    s = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)),
                     torch.device("cuda"), False, "fp32")
    _ = s.model
    return s


@CUDA
def test_on_cuda_the_overlapped_encode_gives_the_plain_loops_vectors(cuda_session, jpeg_folder, tmp_path):
    """Pinned ring, copy stream, asynchronous copies back and the writer thread change when the host waits, never
    the bits: processes and threads give the vectors of a plain synchronous loop over the same batches."""
    folder = load_imagefolder("jpegs", jpeg_folder, "test", None)
    model = cuda_session.model
    plain = np.concatenate([model.encode_images(torch.stack([model.image_transform(folder.load_image(i))
                                                             for i in range(lo, min(lo + 16, len(folder)))]))
                            for lo in range(0, len(folder), 16)])
    for pool in ("processes", "threads"):
        outcome, vectors, positions = encode(cuda_session, folder, tmp_path / pool, num_workers=2, decode_pool=pool)
        assert outcome.encoded == len(folder) and positions.tolist() == list(range(len(folder)))
        assert np.array_equal(vectors.view(np.uint32), plain.view(np.uint32)), pool


@CUDA
def test_on_cuda_nvjpeg_decoding_stays_close_to_pil_and_is_cached_apart(cuda_session, jpeg_folder, tmp_path):
    from clipcache.tasks.encode.gpu_decode import gpu_batches

    folder = load_imagefolder("jpegs", jpeg_folder, "test", None)
    model = cuda_session.model
    batches = list(gpu_batches(folder, model, 0, 16, 2, device=torch.device("cuda")))
    assert [i for b in batches for i in b.indices.tolist()] == list(range(len(folder)))
    device = torch.cat([b.pixels for b in batches])
    assert device.is_cuda
    pil = torch.stack([model.image_transform(folder.load_image(i)) for i in range(len(folder))]).cuda()
    assert (device - pil).abs().mean() < 0.05
    gpu = replace(cuda_session, decode="gpu")
    _, cpu_vectors, _ = encode(cuda_session, folder, tmp_path, num_workers=2)
    outcome, gpu_vectors, _ = encode(gpu, folder, tmp_path, num_workers=2)
    assert not outcome.cache_hit and outcome.encoded == len(folder)  # its own entry beside the PIL one
    assert float((cpu_vectors * gpu_vectors).sum(-1).min()) > 0.99
