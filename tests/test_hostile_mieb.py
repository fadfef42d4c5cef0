"""Hostile `mieb:` Parquet data (issue #45, cases 5 and 7): an image cell stored by path only must name a file inside
--dataset_root (links followed); one that points elsewhere is refused in one line and never opened, encoded or sent
anywhere; a 400-megapixel bomb and junk bytes in an image cell are one line naming the row, not a PIL traceback."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import pytest

from clipcache.tasks.datasets import shapes

from hostile import Tree, assert_refused, run_cli

pytestmark = pytest.mark.hostile


@pytest.fixture(autouse=True)
def quiet_datasets():
    """`datasets` draws a progress bar on stderr while it reads the Parquet files: not an error line."""
    import datasets

    datasets.disable_progress_bars()
    yield
    datasets.enable_progress_bars()


def png_bomb(width: int = 20_000, height: int = 20_000) -> bytes:
    """A valid PNG header declaring width x height pixels (400 MP), with one row of data: tiny on disk."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + \
        chunk(b"IEND", b"")


def png(index: int) -> bytes:
    buffer = io.BytesIO()
    shapes.load_shapes("fixture", "zeroshot_classification", "test", 8).load_image(index).save(buffer, "PNG")
    return buffer.getvalue()


def write_copy(root: Path, odd_cell: dict) -> Path:
    """mteb/cifar10's hub layout (what CIFAR10ZeroShot loads): 8 good images, then ``odd_cell`` in row 8."""
    from datasets import ClassLabel, Dataset, Features, Image

    cells = [{"bytes": png(i), "path": None} for i in range(8)] + [odd_cell]
    import pyarrow.parquet as pq

    table = Dataset.from_dict({"img": cells, "label": [i % 5 for i in range(9)]},
                              features=Features({"img": Image(), "label": ClassLabel(names=list(shapes.CLASSNAMES))}))
    (root / "data").mkdir(parents=True, exist_ok=True)
    # pyarrow, not Dataset.to_parquet: that one would embed the bytes of a path-only cell (reading the file itself)
    pq.write_table(table.data.table, root / "data" / "test-00000-of-00001.parquet")
    return root


def evaluate(tmp_path: Path, root: Path, capsys) -> tuple[int, str]:
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "mieb:CIFAR10ZeroShot",
                            "--dataset_root", str(root), "--quiet", "--orchestrator", "local", "--output_dir",
                            str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")], capsys)
    return code, err


def _outside(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "secret.png"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(png(0))
    return secret


CASES = {
    "an absolute path outside the root": lambda t, root: {"bytes": None, "path": str(_outside(t))},
    "a relative path walking out": lambda t, root: {"bytes": None, "path": f"{root}/../elsewhere/secret.png"},
    "a link inside the root to a file outside": lambda t, root: {"bytes": None, "path": str(
        _link(root / "img.png", _outside(t)))},
    "a URL": lambda t, root: {"bytes": None, "path": "http://127.0.0.1:9/secret.png"},
}


def _link(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


@pytest.mark.parametrize("case", list(CASES))
def test_an_image_path_outside_the_dataset_root_is_refused(tmp_path, capsys, monkeypatch, case):
    root = tmp_path / "cifar10"
    _outside(tmp_path)
    write_copy(root, CASES[case](tmp_path, root))
    opened: list[str] = []  # every file PIL is asked to open: the one outside must never be
    from PIL import Image

    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda fp, *a, **k: opened.append(str(fp)) or real_open(fp, *a, **k))
    tree = Tree(tmp_path)
    code, err = evaluate(tmp_path, root, capsys)
    assert_refused(code, err, "row 8")
    assert "outside --dataset_root" in err or "URL" in err, err
    assert not any("secret" in name for name in opened), opened
    assert not list((tmp_path / "cache").rglob("*.zarr")) and not metric_files(tmp_path)  # nothing kept
    tree.assert_writes_only_under(tmp_path / "cache", tmp_path / "out")


def metric_files(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "out" / "warehouse" / "metrics").glob("*.parquet"))


def test_an_image_path_inside_the_root_is_read(tmp_path, capsys):
    root = tmp_path / "cifar10"
    (root / "images").mkdir(parents=True)
    (root / "images" / "8.png").write_bytes(png(3))
    write_copy(root, {"bytes": None, "path": str(root / "images" / "8.png")})
    code, err = evaluate(tmp_path, root, capsys)
    assert code == 0, err


BAD_BYTES = {"a 400 MP bomb": (png_bomb(), "DecompressionBombError"),
             "junk": (b"this is not an image, just junk bytes" * 10, "not a recognisable image"),
             "a cut PNG": (png(0)[:60], "image does not decode")}


@pytest.mark.parametrize("case", list(BAD_BYTES))
def test_a_bomb_or_junk_in_an_image_cell_is_one_line_naming_the_row(tmp_path, capsys, case):
    data, phrase = BAD_BYTES[case]
    root = write_copy(tmp_path / "cifar10", {"bytes": data, "path": None})
    code, err = evaluate(tmp_path, root, capsys)
    assert_refused(code, err, phrase)
    assert "row 8" in err and "mieb:CIFAR10ZeroShot" in err, err
    assert not list((tmp_path / "cache").rglob("*.zarr")) and not metric_files(tmp_path)
