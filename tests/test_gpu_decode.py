"""Issue #44: the decoding pool keeps ``--prefetch`` batches in flight per worker in a ring allocated once per process,
and ``--decode gpu`` reads ahead on threads, decodes a batch at once on a stream of its own and routes what nvJPEG
does not take to PIL, counted. The pipeline runs here on the CPU (libjpeg in place of nvJPEG, no streams); the CUDA
tests (``-k cuda``) skip themselves without a CUDA device."""

from __future__ import annotations

import io
import os
import threading
import time
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from PIL import Image

from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.labelled import load_imagefolder
from clipcache.tasks.datasets.shapes import ShapesDataset, load_shapes
from clipcache.tasks.encode import decode_pool
from clipcache.tasks.encode.batches import process_batches
from clipcache.tasks.encode.decode_pool import DecodePool, ring_slots
from clipcache.tasks.encode.gpu_decode import DecodeCounts, DeviceTransform, gpu_batches
from clipcache.tasks.encode.jpeg_header import jpeg_route
from clipcache.tasks.encode.preprocess import portable_transform
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

CPU = torch.device("cpu")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")


def encoded(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def model():
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)), CPU, False,
                           "fp32")
    return session.model


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory):
    """JPEGs of two sizes (baseline and progressive), and what nvJPEG's batched decode does not take: greyscale and
    CMYK JPEGs, a PNG, and a file that is no image at all."""
    root = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(44)
    kinds = ["rgb", "rgb", "progressive", "greyscale", "rgb", "cmyk", "png", "rgb", "broken", "rgb", "rgb", "greyscale"]
    for i, kind in enumerate(kinds):
        folder = root / f"class{i % 2}"
        folder.mkdir(exist_ok=True)
        size = (120, 90) if i % 3 else (90, 150)
        image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
        data = {"rgb": lambda im: encoded(im, format="JPEG", quality=90),
                "progressive": lambda im: encoded(im, format="JPEG", quality=90, progressive=True),
                "greyscale": lambda im: encoded(im.convert("L"), format="JPEG"),
                "cmyk": lambda im: encoded(im.convert("CMYK"), format="JPEG"),
                "png": lambda im: encoded(im, format="PNG"),
                "broken": lambda im: b"\xff\xd8 this is not a JPEG"}[kind](image)
        (folder / f"{i:03d}.{'png' if kind == 'png' else 'jpg'}").write_bytes(data)
    return root


# -- the decoding pool -----------------------------------------------------------------------------------------------
def test_ring_slots_keep_prefetch_batches_per_worker_within_the_budget():
    assert ring_slots(16, 2, 154 << 20, 16 << 30) == 34  # the H100 run's batch of 256: 2 per worker + 2
    assert ring_slots(16, 2, 154 << 20, 2 << 30) == 18  # the old fixed 2 GB budget: about one per worker
    assert ring_slots(4, 6, 1 << 20, 1 << 30) == 26


def test_the_ring_is_allocated_and_pinned_once_across_encodes(model, monkeypatch):
    """Two encodes in one process share one shared-memory ring, page-locked once (pinning is counted here in place
    of cudaHostRegister); a later encode that needs more room gets a larger ring, once."""
    pinned, created = [], []
    monkeypatch.setattr(decode_pool, "_pin", lambda ring: pinned.append(ring.data_ptr()) or True)
    monkeypatch.setattr(decode_pool, "_unpin", lambda ring: None)
    real_memfd = os.memfd_create
    monkeypatch.setattr(os, "memfd_create", lambda *a: created.append(a) or real_memfd(*a))
    shapes = load_shapes("shapes", "zeroshot_classification", "test", 40)
    portable = portable_transform(model)
    ranges = [(lo, min(lo + 8, 40)) for lo in range(0, 40, 8)]
    pool = DecodePool(2)
    try:
        runs = []
        for _ in range(2):
            runs.append(torch.cat([b.pixels.clone() for b in process_batches(pool, shapes, portable, ranges,
                                                                              pin_memory=True)]))
        assert (pool.stats.rings, pool.stats.pins, len(created), len(pinned)) == (1, 1, 1, 1)
        assert torch.equal(runs[0], runs[1])
        wide = [(lo, min(lo + 20, 40)) for lo in range(0, 40, 20)]  # larger slots: the ring grows, once
        for _ in range(2):
            assert sum(len(b.indices) for b in process_batches(pool, shapes, portable, wide, pin_memory=True)) == 40
        assert (pool.stats.rings, pool.stats.pins, len(created)) == (2, 2, 2)
    finally:
        pool.close()


def test_two_encodes_through_the_encode_stage_share_the_process_pool_and_its_ring(tmp_path):
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.contract import EncodeSettings
    from clipcache.tasks.encode.decode_pool import acquire_pool, release_pool
    from clipcache.tasks.encode.stage import encode_images, image_key_fields
    from clipcache.tasks.progress import StageProgress

    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)), CPU, False,
                           "fp32")
    dataset = load_shapes("shapes", "zeroshot_classification", "test", 48)
    fields = image_key_fields(session, dataset.identity(FileHashMemo(None)), "test", None)
    seen = []
    for n in range(2):
        encode_images(session, dataset, EmbeddingStore(tmp_path / f"c{n}"), fields,
                      EncodeSettings(16, num_workers=2, decode_pool="processes"), StageProgress(enabled=False))
        pool = acquire_pool(2)
        seen.append((pool, pool.stats.rings))
        release_pool(pool)
    assert seen[0] == seen[1]  # the same pool, and no ring allocated by the second encode


@pytest.mark.parametrize("prefetch", [1, 3])
def test_batches_in_flight_per_worker_honour_prefetch(model, prefetch):
    shapes = load_shapes("shapes", "zeroshot_classification", "test", 60)
    ranges = [(lo, min(lo + 4, 60)) for lo in range(0, 60, 4)]
    pool = DecodePool(2)
    try:
        seen = [i for b in process_batches(pool, shapes, portable_transform(model), ranges, prefetch=prefetch)
                for i in b.indices.tolist()]
        assert seen == list(range(60))
        assert (pool.stats.max_per_worker, pool.stats.max_in_flight) == (prefetch, 2 * prefetch)
    finally:
        pool.close()


# -- --decode gpu's pipeline, run on the CPU -------------------------------------------------------------------------
def test_jpeg_route_sends_what_nvjpeg_batches_do_not_take_to_pil():
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    assert jpeg_route(encoded(rgb, format="JPEG")) == "nvjpeg"
    assert jpeg_route(encoded(rgb, format="JPEG", progressive=True)) == "nvjpeg"
    assert jpeg_route(encoded(rgb.convert("L"), format="JPEG")) == "greyscale"
    assert jpeg_route(encoded(rgb.convert("CMYK"), format="JPEG")) == "cmyk"
    assert jpeg_route(encoded(rgb, format="PNG")) == "not_jpeg"
    assert jpeg_route(rgb) == "not_jpeg"  # an image a reader builds in memory
    assert jpeg_route(b"\xff\xd8 not a JPEG") == "other"
    assert jpeg_route(b"\xff\xd8") == "other"


def test_grouped_device_preprocessing_equals_one_image_at_a_time_to_the_bit(model):
    transform = DeviceTransform.of(model, CPU)
    rng = np.random.default_rng(1)
    sizes = [(375, 500), (500, 375), (375, 500), (40, 30), (375, 500), (64, 64)]  # (40, 30): padded crop
    images = [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)) for h, w in sizes]
    alone = torch.stack([transform(image) for image in images])
    together = transform.batch(images)
    assert together.shape == alone.shape
    assert torch.equal(together.view(torch.int32), alone.view(torch.int32))
    same_size = [images[0], images[2], images[4]]  # one group: resized in place, in one call
    assert torch.equal(transform.batch(same_size).view(torch.int32), alone[[0, 2, 4]].view(torch.int32))


def reference_pixels(dataset, transform: DeviceTransform, indices: list[int]) -> torch.Tensor:
    """Today's --decode gpu, one image at a time: a JPEG of three components through decode_jpeg, the rest
    through PIL; then the device preprocessing of that one image."""
    from torchvision.io import ImageReadMode, decode_jpeg

    out = []
    for i in indices:
        raw = dataset.read_image_bytes(i)
        if jpeg_route(raw) == "nvjpeg":
            image = decode_jpeg(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=ImageReadMode.RGB)
        else:
            image = torch.from_numpy(np.array(dataset.load_image(i))).permute(2, 0, 1)
        out.append(transform(image))
    return torch.stack(out)


def test_the_pipeline_gives_the_per_image_pixels_and_counts_who_decoded_what(model, mixed_folder):
    folder = load_imagefolder("mixed", mixed_folder, "test", None)
    counts = DecodeCounts()
    batches = list(gpu_batches(folder, model, 0, 5, 2, device=CPU, counts=counts))
    assert [b.size for b in batches] == [5, 5, 2]
    indices = [i for b in batches for i in b.indices.tolist()]
    errors = [e for b in batches for e in b.errors]
    broken = [i for i in range(len(folder)) if "008.jpg" in folder.describe(i)]
    assert [i for i, _ in errors] == broken and "does not decode" in errors[0][1]
    assert indices == [i for i in range(len(folder)) if i not in broken]
    expected = reference_pixels(folder, DeviceTransform.of(model, CPU), indices)
    got = torch.cat([b.pixels for b in batches])
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    assert (counts.nvjpeg, counts.greyscale, counts.cmyk, counts.not_jpeg, counts.other) == (7, 2, 1, 1, 0)
    assert counts.by_pil == 4 and "2 greyscale" in counts.describe()


@dataclass
class RecordedReads(ShapesDataset):
    """Remembers which thread read which image; image ``fails_at`` raises a bug (not a bad image)."""

    fails_at: int = -1

    def __post_init__(self) -> None:
        self.reads: list[tuple[str, int]] = []

    def read_image_bytes(self, index: int):
        if index == self.fails_at:
            raise RuntimeError(f"reader bug at {index}")
        self.reads.append((threading.current_thread().name, index))
        return super().read_image_bytes(index)


def test_reads_run_ahead_on_threads_bounded_by_prefetch(model):
    dataset = RecordedReads(**vars(load_shapes("ahead", "zeroshot_classification", "test", 160)))
    batches = gpu_batches(dataset, model, 0, 8, 2, device=CPU, prefetch=2)
    first = next(batches)
    time.sleep(0.5)  # the consumer is slow: the pipeline fills up, and stops there
    read = {i // 8 for _, i in dataset.reads}
    # 2 threads x 2 batches read ahead, + the batches decoded: the one yielded, 2 waiting, 1 in hand
    assert 5 <= len(read) <= 2 * 2 + 2 + 2, sorted(read)
    assert first.indices.tolist() == list(range(8))
    assert {name.startswith("clipcache-read") for name, _ in dataset.reads} == {True}
    rest = [i for b in batches for i in b.indices.tolist()]
    assert rest == list(range(8, 160))


def test_a_failure_in_the_pipeline_is_raised_in_the_consumer_and_nothing_is_left_running(model):
    dataset = RecordedReads(**vars(load_shapes("fails", "zeroshot_classification", "test", 80)), fails_at=43)
    with pytest.raises(RuntimeError, match="reader bug at 43"):
        for _ in gpu_batches(dataset, model, 0, 8, 2, device=CPU):
            pass
    closed = gpu_batches(replace(dataset, fails_at=-1), model, 0, 8, 2, device=CPU)
    next(closed)
    closed.close()  # a consumer that stops early (an error in the encode) stops the decoding thread and readers
    names = {t.name for t in threading.enumerate()}
    assert not any(n.startswith(("clipcache-gpu-decode", "clipcache-read")) for n in names), names


def test_bad_images_stay_one_line_each(model, mixed_folder):
    folder = load_imagefolder("mixed", mixed_folder, "test", None)
    errors = [e for b in gpu_batches(folder, model, 0, 4, 1, device=CPU) for e in b.errors]
    assert len(errors) == 1 and "\n" not in errors[0][1] and "008.jpg" in errors[0][1]


# -- on a CUDA device ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_model():
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)),
                           torch.device("cuda"), False, "fp32")
    return session.model


@CUDA
def test_on_cuda_the_batched_pipeline_gives_the_per_image_pixels(cuda_model, mixed_folder):
    """nvJPEG on a whole batch, grouped resizes and a decoding stream of its own: the pixels of one image at a time
    on the device (no race between the decoding and the consuming stream would leave these equal)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    folder = load_imagefolder("mixed", mixed_folder, "test", None)
    counts = DecodeCounts()
    device = torch.device("cuda")
    batches = list(gpu_batches(folder, cuda_model, 0, 5, 2, device=device, counts=counts))
    indices = [i for b in batches for i in b.indices.tolist()]
    got = torch.cat([b.pixels for b in batches])
    transform = DeviceTransform.of(cuda_model, device)
    expected = []
    for i in indices:
        raw = folder.read_image_bytes(i)
        if jpeg_route(raw) == "nvjpeg":
            image = decode_jpeg(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=ImageReadMode.RGB,
                                device=device)
        else:
            image = torch.from_numpy(np.array(folder.load_image(i))).permute(2, 0, 1).to(device)
        expected.append(transform(image))
    assert torch.equal(got.view(torch.int32), torch.stack(expected).view(torch.int32))
    assert (counts.nvjpeg, counts.greyscale, counts.cmyk, counts.not_jpeg) == (7, 2, 1, 1)


@CUDA
def test_on_cuda_decode_gpu_encodes_as_a_synchronous_loop_does(cuda_model, tmp_path):
    """The encode with --decode gpu (decoding stream, events, overlapped forward passes) gives the vectors of a
    loop that decodes a batch, waits, and encodes it, bit for bit."""
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.contract import EncodeSettings
    from clipcache.tasks.datasets import open_dataset
    from clipcache.tasks.encode.stage import encode_images, image_key_fields
    from clipcache.tasks.progress import StageProgress

    from conftest import write_wds

    root = write_wds(tmp_path / "wds", "classification", 70, fmt="jpg")
    dataset = open_dataset("wds/jpegs", str(root), "test", None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)),
                           torch.device("cuda"), False, "fp32", decode="gpu")
    session._model = cuda_model
    plain = []
    for batch in gpu_batches(dataset, cuda_model, 0, 16, 2, device=torch.device("cuda"), prefetch=1):
        torch.cuda.synchronize()
        plain.append(cuda_model.encode_images(batch.pixels.clone()))
    store = EmbeddingStore(tmp_path / "cache")
    fields = image_key_fields(session, dataset.identity(FileHashMemo(None)), "test", None)
    outcome = encode_images(session, dataset, store, fields, EncodeSettings(16, num_workers=2),
                            StageProgress(enabled=False))
    vectors = store.open(outcome.ref.key).embeddings()
    assert np.array_equal(vectors.view(np.uint32), np.concatenate(plain).view(np.uint32))
