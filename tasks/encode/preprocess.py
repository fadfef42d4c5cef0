"""A model's image preprocessing in a form that decoding worker processes can run cheaply.

Most CLIP models preprocess with the same torchvision chain (open_clip's ``image_transform``): Resize of the shorter
side, CenterCrop, RGB, ToTensor, Normalize. :func:`lower` rewrites that chain as the same operations on PIL and
NumPy, so a worker process imports neither torch nor torchvision (importing torchvision costs 2-15 s here, because
it imports ``torch._dynamo``; NumPy and PIL about 0.3 s). The numbers do not change:

- Resize and CenterCrop are the same PIL calls with the same arguments (``Image.resize``, ``Image.crop``,
  ``ImageOps.expand`` for the padding of a crop larger than the image), sizes computed by torchvision's formulas;
- ToTensor and Normalize are one float32 conversion, division or subtraction per element, which IEEE 754 rounds the
  same way in NumPy and torch (torch's CPU kernels divide; they do not multiply by a reciprocal).

tests/test_input_pipeline.py holds the two to the bit on real images. A chain with any other step (open_clip's
``ResizeKeepRatio``, a Hugging Face image processor) is left as it is: the worker then unpickles it and imports what
it needs.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageOps

# torchvision's InterpolationMode values -> PIL resampling filters (torchvision.transforms.functional.pil_modes_mapping)
PIL_FILTERS = {"nearest": 0, "nearest-exact": 0, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5, "lanczos": 1}


def resized_size(height: int, width: int, size: tuple[int, ...], max_size: int | None) -> tuple[int, int]:
    """torchvision's ``_compute_resized_output_size``: (height, width) after Resize(size, max_size)."""
    if len(size) == 2:
        return size[0], size[1]
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size[0], int(size[0] * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return new_h, new_w


@dataclass(frozen=True)
class Resize:
    size: tuple[int, ...]  # (shorter side,) or (height, width)
    resample: int  # a PIL filter
    max_size: int | None = None

    def __call__(self, image: Image.Image) -> Image.Image:
        height, width = resized_size(image.height, image.width, self.size, self.max_size)
        if (height, width) == (image.height, image.width):
            return image
        return image.resize((width, height), self.resample)


@dataclass(frozen=True)
class CenterCrop:
    height: int
    width: int

    def __call__(self, image: Image.Image) -> Image.Image:
        h, w = self.height, self.width
        if w > image.width or h > image.height:  # torchvision pads with 0 first
            pad = ((w - image.width) // 2 if w > image.width else 0, (h - image.height) // 2 if h > image.height else 0,
                   (w - image.width + 1) // 2 if w > image.width else 0,
                   (h - image.height + 1) // 2 if h > image.height else 0)
            image = _pad(image, pad)
            if (image.width, image.height) == (w, h):
                return image
        top = int(round((image.height - h) / 2.0))
        left = int(round((image.width - w) / 2.0))
        return image.crop((left, top, left + w, top + h))


def _pad(image: Image.Image, border: tuple[int, int, int, int]) -> Image.Image:
    """torchvision's PIL ``pad`` with the constant fill 0."""
    bands = len(image.getbands())
    fill: Any = (0,) * bands if bands > 1 else 0
    if image.mode == "F":
        fill = tuple(float(x) for x in fill) if bands > 1 else 0.0
    if image.mode == "P" and (palette := image.getpalette()) is not None:
        padded = ImageOps.expand(image, border=border, fill=fill)
        padded.putpalette(palette)
        return padded
    return ImageOps.expand(image, border=border, fill=fill)


@dataclass(frozen=True)
class ConvertMode:
    """PIL ``convert`` (open_clip's ``MaybeConvertMode`` / ``_convert_to_rgb``); arrays pass through."""

    mode: str = "RGB"

    def __call__(self, image: Any) -> Any:
        return image.convert(self.mode) if isinstance(image, Image.Image) else image


@dataclass(frozen=True)
class ToFloatArray:
    """torchvision's ``to_tensor`` on a PIL image: (C, H, W), uint8 scaled to float32 in [0, 1]."""

    def __call__(self, image: Any) -> np.ndarray:
        if not isinstance(image, Image.Image):
            return np.asarray(image)
        types = {"I": np.int32, "I;16" if sys.byteorder == "little" else "I;16B": np.int16, "F": np.float32}
        array = np.array(image, types.get(image.mode, np.uint8), copy=True)
        if image.mode == "1":
            array = 255 * array
        array = array.reshape(image.height, image.width, len(image.getbands())).transpose(2, 0, 1)
        if array.dtype != np.uint8:
            return np.ascontiguousarray(array)
        out = array.astype(np.float32)  # a C-contiguous copy, as torch's .contiguous().to(float32)
        np.divide(out, np.float32(255), out=out)
        return out


@dataclass(frozen=True)
class Normalize:
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __call__(self, array: np.ndarray) -> np.ndarray:
        if not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"Input tensor should be a float tensor. Got {array.dtype}.")
        mean = np.asarray(self.mean, dtype=array.dtype)
        std = np.asarray(self.std, dtype=array.dtype)
        if (std == 0).any():
            raise ValueError(f"std evaluated to zero after conversion to {array.dtype}, leading to division by zero.")
        out = np.empty_like(array)
        for c in range(array.shape[0]):  # a scalar per channel: 3x faster than broadcasting (C, 1, 1), same bits
            m, s = mean[c if mean.size > 1 else 0], std[c if std.size > 1 else 0]
            np.subtract(array[c], m, out=out[c])
            np.divide(out[c], s, out=out[c])
        return out


@dataclass(frozen=True)
class Preprocess:
    """A lowered chain: the steps in order."""

    steps: tuple[Any, ...]

    def __call__(self, image: Image.Image) -> Any:
        for step in self.steps:
            image = step(image)
        return image


def _qualname(obj: Any) -> str:
    """``module.name`` of a function, else of the object's exact class (a subclass may do something else)."""
    kind = obj if isinstance(obj, types.FunctionType) else type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _lower_step(step: Any) -> list[Any] | None:
    name = _qualname(step)
    if name == "torchvision.transforms.transforms.Compose":
        parts = [_lower_step(s) for s in step.transforms]
        return None if any(p is None for p in parts) else [s for p in parts if p is not None for s in p]
    if name == "torchvision.transforms.transforms.Resize":
        size = (step.size,) if isinstance(step.size, int) else tuple(int(s) for s in step.size)
        mode = step.interpolation
        resample = int(mode) if isinstance(mode, int) else PIL_FILTERS.get(str(getattr(mode, "value", "")))
        if resample is None or len(size) not in (1, 2) or (step.max_size is not None and len(size) != 1):
            return None
        return [Resize(size, resample, step.max_size)]
    if name == "torchvision.transforms.transforms.CenterCrop":
        height, width = step.size
        return [CenterCrop(int(height), int(width))]
    if name in ("torchvision.transforms.transforms.ToTensor", "open_clip.transform.MaybeToTensor"):
        return [ToFloatArray()]
    if name == "torchvision.transforms.transforms.Normalize":
        return [Normalize(tuple(float(m) for m in step.mean), tuple(float(s) for s in step.std))]
    if name == "open_clip.transform.MaybeConvertMode":
        return [ConvertMode(step.mode)]
    if name == "open_clip.transform._convert_to_rgb":
        return [ConvertMode("RGB")]
    return None


def lower(transform: Any) -> Preprocess | None:
    """``transform`` as PIL + NumPy steps when every step of it is a known torchvision / open_clip one, else None."""
    steps = _lower_step(transform)
    return Preprocess(tuple(steps)) if steps else None


def portable_transform(model: Any) -> Any | None:
    """What a decoding process runs for ``model``: its preprocessing lowered to PIL + NumPy where possible, else its
    own picklable transform; None for a model whose ``image_transform`` needs the model itself (an API model)."""
    own = model.portable_image_transform()
    if own is None:
        return None
    return lower(own) or own
