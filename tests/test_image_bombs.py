"""A decompression bomb is refused from its header the same way on every path (tasks/datasets/image_bytes.py): the CPU
decode, a ``mieb:`` task's image cells, and ``--decode gpu``, whose reader threads check the size a JPEG's frame
header declares before nvJPEG sees a byte. The bombs are a few hundred bytes: a real 16 x 16 JPEG whose frame
header is rewritten. The GPU path's host side runs here (libjpeg on the CPU in place of nvJPEG); nothing needs CUDA."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.image_bytes import check_image_size
from clipcache.tasks.datasets.labelled import load_imagefolder
from clipcache.tasks.datasets.mieb.mieb_images import _check_cell
from clipcache.tasks.encode import gpu_decode
from clipcache.tasks.encode.batches import load_item
from clipcache.tasks.encode.gpu_decode import gpu_batches, read_batch
from clipcache.tasks.encode.jpeg_header import jpeg_header
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

CPU = torch.device("cpu")
HUGE = (65_000, 65_000)  # 4.2 gigapixels: 12.7 GB of RGB, far over PIL's 2 x 89,478,485


def jpeg(width: int = 16, height: int = 16, *, progressive: bool = False) -> bytes:
    rng = np.random.default_rng(width * 7 + height)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        buffer, format="JPEG", progressive=progressive)
    return buffer.getvalue()


def sof_at(data: bytes) -> int:
    return next(i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC2))


def with_size(data: bytes, width: int, height: int) -> bytes:
    """``data`` with its frame header declaring width x height (the scan data left as it is)."""
    i = sof_at(data)
    return data[:i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[i + 9:]


def with_second_frame(data: bytes, width: int, height: int) -> bytes:
    """A copy of the frame header, declaring width x height, inserted right after the first."""
    i = sof_at(data)
    end = i + 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return data[:end] + with_size(data[i:end], width, height) + data[end:]


@pytest.fixture(scope="module")
def model():
    return ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)), CPU, False,
                        "fp32").model


@pytest.fixture
def folder(tmp_path):
    """Six JPEGs, the fourth a bomb (baseline) and the sixth a progressive one."""
    files = [jpeg(40, 30), jpeg(30, 40), jpeg(), with_size(jpeg(), *HUGE), jpeg(20, 20),
             with_size(jpeg(progressive=True), 30_000, 30_000)]
    (tmp_path / "cls").mkdir()
    for k, data in enumerate(files):
        (tmp_path / "cls" / f"{k:03d}.jpg").write_bytes(data)
    return load_imagefolder("bombs", tmp_path, "test", None)


def test_the_header_reader_gives_the_declared_size_of_a_tiny_bomb():
    bomb = with_size(jpeg(), *HUGE)
    assert len(bomb) < 1000
    assert jpeg_header(bomb) == ("nvjpeg", HUGE)
    assert jpeg_header(with_size(jpeg(progressive=True), 300, 200)) == ("nvjpeg", (300, 200))
    assert jpeg_header(jpeg(50, 40)) == ("nvjpeg", (50, 40))
    with Image.open(io.BytesIO(jpeg(50, 40))) as img:
        assert img.size == (50, 40)  # (width, height), as PIL reads it


def test_a_second_frame_header_or_a_size_of_zero_is_never_nvjpegs():
    """PIL sizes an image by its last frame header; a JPEG with two (either one the bomb) or with a height of 0 goes
    to PIL, so nvJPEG only ever gets the one size that was checked."""
    assert jpeg_header(with_second_frame(jpeg(), *HUGE))[0] == "other"
    assert jpeg_header(with_second_frame(with_size(jpeg(), *HUGE), 16, 16))[0] == "other"
    assert jpeg_header(with_size(jpeg(), 16, 0))[0] == "other"
    assert jpeg_header(jpeg()[:sof_at(jpeg()) + 40])[0] == "other"  # no scan: a header cut short


@pytest.mark.parametrize("size", [HUGE, (65_535, 2_800)])
def test_the_gpu_check_refuses_a_bomb_in_the_cpu_paths_words(folder, size):
    bomb = with_size(jpeg(), *size)
    with pytest.raises(DatasetError) as gpu:
        check_image_size(jpeg_header(bomb)[1], lambda: "the/file.jpg")
    with pytest.raises(DatasetError) as mieb:
        _check_cell({"bytes": bomb, "path": None}, "the/file.jpg", None)
    assert str(gpu.value) == str(mieb.value)
    assert str(gpu.value).startswith("image does not decode: the/file.jpg (DecompressionBombError: Image size (")
    assert "\n" not in str(gpu.value)
    with pytest.raises(DatasetError) as cpu:
        folder.load_image(3)
    assert str(cpu.value) == f"image does not decode: {folder.describe(3)} (DecompressionBombError: " \
                             f"Image size ({HUGE[0] * HUGE[1]} pixels) exceeds limit of " \
                             f"{2 * Image.MAX_IMAGE_PIXELS} pixels, could be decompression bomb DOS attack.)"


@pytest.mark.parametrize("limit", [50, 1_000])
def test_the_bound_is_pils_at_the_boundary_and_follows_max_image_pixels(monkeypatch, limit):
    """Sizes on either side of 2 x MAX_IMAGE_PIXELS: the GPU path's check refuses exactly what PIL's own open
    refuses; between 1x and 2x both only warn; with the bound turned off (None) nothing is refused."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
    for width, height in [(2 * limit, 1), (2 * limit + 1, 1), (1, limit), (1, limit + 1), (limit, 3), (7, 7)]:
        data = with_size(jpeg(), width, height)
        with warnings.catch_warnings(record=True) as pil_warned:
            warnings.simplefilter("always")
            try:
                _check_cell({"bytes": data, "path": None}, "x", None)
                pil_refused = False
            except DatasetError as e:
                pil_refused = "DecompressionBombError" in str(e)
        with warnings.catch_warnings(record=True) as gpu_warned:
            warnings.simplefilter("always")
            try:
                check_image_size(jpeg_header(data)[1], lambda: "x")
                gpu_refused = False
            except DatasetError:
                gpu_refused = True
        assert gpu_refused == pil_refused == (width * height > 2 * limit), (width, height)
        bomb_warnings = [[type(w.message) for w in ws].count(Image.DecompressionBombWarning)
                         for ws in (pil_warned, gpu_warned)]
        assert bomb_warnings == [int(limit < width * height <= 2 * limit)] * 2, (width, height)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    check_image_size(HUGE, lambda: "x")  # the user turned PIL's bound off: so is ours


def test_the_reader_threads_refuse_a_bomb_before_nvjpeg_and_the_rest_is_read(folder):
    items = read_batch(folder, 0, len(folder))
    assert [item.route for item in items] == ["nvjpeg", "nvjpeg", "nvjpeg", "error", "nvjpeg", "error"]
    for k in (3, 5):
        assert items[k].data is None and items[k].pixels is None  # no bytes left for nvJPEG, nothing decoded
        assert items[k].error == load_item(folder, lambda image: image, k)[2]  # the CPU path's line, to the letter
        assert folder.describe(k) in items[k].error and "DecompressionBombError" in items[k].error


def test_a_bomb_is_skipped_by_the_gpu_pipeline_as_by_the_cpu_one(folder, model, monkeypatch):
    """The whole --decode gpu pipeline (reader threads, the batched decode, the device preprocessing) on the CPU: the
    bombs are the batch's errors (what --on_bad_image skip counts in skipped_images, or fails on, as on the CPU),
    the decoder never gets their bytes, and every other image is encoded."""
    handed: list[bytes] = []
    real = gpu_decode._decode_jpegs

    def spy(data, device):
        handed.extend(bytes(t.numpy()) for t in data)
        return real(data, device)

    monkeypatch.setattr(gpu_decode, "_decode_jpegs", spy)
    batches = list(gpu_batches(folder, model, 0, 4, 2, device=CPU))
    errors = [e for b in batches for e in b.errors]
    transform = model.image_transform
    cpu_errors = [(i, err) for i, _, err in (load_item(folder, transform, i) for i in range(len(folder))) if err]
    assert errors == cpu_errors and [i for i, _ in errors] == [3, 5]
    assert [i for b in batches for i in b.indices.tolist()] == [0, 1, 2, 4]
    assert sorted(handed) == sorted(folder.read_image_bytes(i) for i in (0, 1, 2, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
def test_on_cuda_a_bomb_never_reaches_nvjpeg(folder):
    """The same pipeline with nvJPEG on the device: the bombs are the CPU path's errors, the rest is decoded."""
    cuda = torch.device("cuda")
    model = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)), cuda, False,
                         "fp32").model
    batches = list(gpu_batches(folder, model, 0, 4, 2, device=cuda))
    cpu_errors = [(i, err) for i, _, err in (load_item(folder, model.image_transform, i) for i in range(len(folder)))
                  if err]
    assert [e for b in batches for e in b.errors] == cpu_errors and [i for i, _ in cpu_errors] == [3, 5]
    assert [i for b in batches for i in b.indices.tolist()] == [0, 1, 2, 4]
