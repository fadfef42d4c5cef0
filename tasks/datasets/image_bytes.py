"""Encoded image bytes opened the one way every reader opens them, with PIL's decompression-bomb bound.

Data is untrusted, and a few kilobytes can declare a 65,000 x 65,000 image. PIL refuses an image over
``2 x PIL.Image.MAX_IMAGE_PIXELS`` pixels from its header, before decoding a pixel, and only warns between 1x and 2x;
its ``DecompressionBombError`` (and junk bytes) become one line naming the image, never a traceback. Three paths
share this definition:

- the CPU decode (``EvalDataset.load_image``) and the checks of a ``mieb:`` task's image cells
  (tasks/datasets/mieb/mieb_images.py) open bytes through :func:`opened_image`, where PIL applies the bound;
- ``--decode gpu`` (tasks/encode/gpu_decode.py) reads a JPEG's size from its frame header itself and hands the bytes
  to nvJPEG, which has no such bound, only after :func:`check_image_size` (PIL's own check, the one ``Image.open``
  runs) let the size through. A bomb is then refused in the same words, and skipped or fatal as on the CPU.

``MAX_IMAGE_PIXELS`` is read at each call, so a user who changes it (or sets it to None) changes all three at once.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from PIL import Image, UnidentifiedImageError

from clipcache.storage.errors import DatasetError


def undecodable(where: str, error: Exception) -> DatasetError:
    """The one line for an image that does not decode (``where``: the file, shard member or row)."""
    if isinstance(error, UnidentifiedImageError):
        return DatasetError(f"image does not decode: {where} (not a recognisable image)")
    return DatasetError(f"image does not decode: {where} ({type(error).__name__}: {error})")


@contextmanager
def opened_image(data: bytes, where: Callable[[], str]) -> Iterator[Image.Image]:
    """PIL's lazy open of ``data`` (its header read, nothing decoded yet); whatever goes wrong inside the block too,
    loading or verifying the pixels included, is DatasetError naming ``where()`` (called only then)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            yield img
    except DatasetError:
        raise
    except Exception as e:  # PIL raises many types for bad data (DecompressionBombError, OSError, SyntaxError...)
        raise undecodable(where(), e) from e


def check_image_size(size: tuple[int, int], where: Callable[[], str]) -> None:
    """Refuse an image of ``size`` (width, height), read from its header by a decoder other than PIL, as
    :func:`opened_image` refuses it: over ``2 x MAX_IMAGE_PIXELS`` is DatasetError (PIL's words), between 1x and 2x
    PIL's ``DecompressionBombWarning``."""
    try:
        Image._decompression_bomb_check(size)  # the check Image.open runs on every header (PIL's plugins call it too)
    except Image.DecompressionBombError as e:
        raise undecodable(where(), e) from e
