"""Which decoder takes an image under ``--decode gpu``, read from a JPEG's markers (a few microseconds an image, where
PIL's ``Image.open`` takes over a hundred): nvJPEG's batched decode, or PIL and why; and the size the frame header
declares, which tasks/encode/gpu_decode.py checks against PIL's decompression-bomb bound before nvJPEG sees a byte."""

from __future__ import annotations

from PIL import Image

_JPEG = b"\xff\xd8"
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # start-of-frame markers
_STANDALONE = {0x01, *range(0xD0, 0xD9)}  # markers without a length: TEM, RSTn, SOI


def jpeg_route(raw: bytes | Image.Image) -> str:
    """Who decodes an image, from its first bytes: ``nvjpeg`` (an 8-bit baseline, extended or progressive JPEG of 3
    components), else the reason PIL does: ``not_jpeg``, ``greyscale`` (1 component), ``cmyk`` (4: CMYK or YCCK) or
    ``other`` (lossless, arithmetic-coded, 12-bit, or a header that does not parse: PIL says what is wrong)."""
    return jpeg_header(raw)[0]


def jpeg_header(raw: bytes | Image.Image) -> tuple[str, tuple[int, int] | None]:
    """:func:`jpeg_route` and the (width, height) its frame header declares (None unless a JPEG). The markers are
    read up to the first scan, so a second frame header (sizes PIL and nvJPEG might read differently), a size of 0
    (given later by a DNL marker) or no scan at all sends the image to PIL: nvJPEG only gets a JPEG whose one size
    was checked against the decompression-bomb bound."""
    if not isinstance(raw, bytes | bytearray) or raw[:2] != _JPEG:
        return "not_jpeg", None
    i, n = 2, len(raw)
    route, size = "other", None
    while i + 4 <= n:
        if raw[i] != 0xFF:
            return "other", size
        marker = raw[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _STANDALONE:
            i += 2
            continue
        if marker == 0xDA:  # the first scan: the frame header, if any, came before it
            return (route if size is not None and 0 not in size else "other"), size
        if marker in _SOF:
            if size is not None or i + 10 > n:
                return "other", size
            size = int.from_bytes(raw[i + 7:i + 9], "big"), int.from_bytes(raw[i + 5:i + 7], "big")
            route = "other" if marker not in (0xC0, 0xC1, 0xC2) or raw[i + 4] != 8 else \
                {3: "nvjpeg", 1: "greyscale", 4: "cmyk"}.get(raw[i + 9], "other")
        i += 2 + int.from_bytes(raw[i + 2:i + 4], "big")
    return "other", size
