"""The synthetic "shapes" datasets: coloured shapes on plain backgrounds, generated deterministically from a seed.

They make the offline default meaningful: the bundled tiny CLIP was trained on the ``train`` split and is evaluated on
the held-out ``test`` split (different seeds, so no test image was seen in training).

- ``shapes``: zero-shot classification over 30 classes (6 colours x 5 shapes), e.g. "red circle".
- ``shapes_retrieval``: image-text retrieval; each image has 1-3 captions that also name size, position and background.

Sample ``i`` of a split is drawn from ``numpy.random.default_rng([split_seed, i])`` alone, so any sample can be made on
its own, in any worker, in any order, and always comes out the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, ImageDraw

from clipcache.tasks.datasets.base import ClassPrompts, EvalDataset, Task

if TYPE_CHECKING:
    from clipcache.storage.hashing import FileHashMemo

GENERATOR_VERSION = 2
IMAGE_SIZE = 64
COLOURS = {
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
    "yellow": (235, 200, 30), "purple": (140, 60, 180), "orange": (240, 130, 20),
}
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
BACKGROUNDS = {"white": (245, 245, 245), "black": (20, 20, 20), "gray": (128, 128, 128)}
SIZES = {"small": (8, 11), "large": (15, 19)}
POSITIONS = {"left": (0.28, 0.5), "right": (0.72, 0.5), "top": (0.5, 0.28), "bottom": (0.5, 0.72), "center": (0.5, 0.5)}
POSITION_WORDS = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom",
                  "center": "in the center"}
CLASSNAMES = [f"{colour} {shape}" for colour in COLOURS for shape in SHAPES]
TEMPLATES = ["a photo of a {c}.", "a drawing of a {c}.", "a {c}.", "a {c} on a plain background."]
SPLIT_SEEDS = {"train": 1729, "test": 4104}
DEFAULT_SIZES = {("shapes", "test"): 1200, ("shapes_retrieval", "test"): 600}


@dataclass(frozen=True)
class ShapeSample:
    colour: str
    shape: str
    size: str
    position: str
    background: str
    radius: int
    jitter: tuple[int, int]

    @property
    def label(self) -> int:
        return CLASSNAMES.index(f"{self.colour} {self.shape}")


def draw_sample(rng: np.random.Generator, label: int | None = None) -> ShapeSample:
    if label is None:
        label = int(rng.integers(len(CLASSNAMES)))
    colour, shape = CLASSNAMES[label].split(" ")
    size = str(rng.choice(list(SIZES)))
    lo, hi = SIZES[size]
    return ShapeSample(
        colour=colour, shape=shape, size=size,
        position=str(rng.choice(list(POSITIONS))),
        background=str(rng.choice(list(BACKGROUNDS))),
        radius=int(rng.integers(lo, hi + 1)),
        jitter=(int(rng.integers(-3, 4)), int(rng.integers(-3, 4))),
    )


def render(s: ShapeSample) -> Image.Image:
    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUNDS[s.background])
    draw = ImageDraw.Draw(img)
    fx, fy = POSITIONS[s.position]
    cx, cy = fx * IMAGE_SIZE + s.jitter[0], fy * IMAGE_SIZE + s.jitter[1]
    r, fill = s.radius, COLOURS[s.colour]
    if s.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif s.shape == "square":
        q = r * 0.85
        draw.rectangle([cx - q, cy - q, cx + q, cy + q], fill=fill)
    elif s.shape == "triangle":
        pts = [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
        draw.polygon(pts, fill=fill)
    elif s.shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r * 0.75, cy), (cx, cy + r), (cx - r * 0.75, cy)], fill=fill)
    else:  # cross
        w = max(2, r // 3)
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
    return img


CAPTION_STYLES = (
    "a {size} {colour} {shape} {where} on a {background} background",
    "a picture of a {size} {colour} {shape} {where}, {background} background",
    "{size} {colour} {shape} {where} over {background}",
    "there is a {size} {colour} {shape} {where}, {background} background",
)


def caption(s: ShapeSample, style: int) -> str:
    return CAPTION_STYLES[style % len(CAPTION_STYLES)].format(
        size=s.size, colour=s.colour, shape=s.shape, where=POSITION_WORDS[s.position], background=s.background)


def sample_at(split: str, index: int) -> tuple[ShapeSample, np.random.Generator]:
    rng = np.random.default_rng([SPLIT_SEEDS[split], index])
    # Classes cycle so every class is equally present in any prefix of 30k samples.
    return draw_sample(rng, label=index % len(CLASSNAMES)), rng


@dataclass
class ShapesDataset(EvalDataset):
    n: int = 0
    samples: list[ShapeSample] = field(default_factory=list)

    def __len__(self) -> int:
        return self.n

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {"format": "shapes", "generator_version": GENERATOR_VERSION, "seed": SPLIT_SEEDS[self.split],
                "n": self.n, "task": self.task}

    def describe(self, index: int) -> str:
        return f"{self.name}/{self.split} sample {index}"

    def read_image_bytes(self, index: int) -> Image.Image:
        return render(self.samples[index])


def load_shapes(name: str, task: Task, split: str, limit: int | None, size: int | None = None) -> ShapesDataset:
    from clipcache.storage.errors import DatasetError

    if split not in SPLIT_SEEDS:
        raise DatasetError(f"dataset {name!r} has no split {split!r} (available splits: {', '.join(SPLIT_SEEDS)})")
    n = size or DEFAULT_SIZES.get((name, split), 1200)
    if limit is not None:
        n = min(n, limit)
    ds = ShapesDataset(name=name, split=split, task=task, n=n)
    captions = []
    for i in range(n):
        s, rng = sample_at(split, i)
        ds.samples.append(s)
        if task == "zeroshot_retrieval":
            first = int(rng.integers(len(CAPTION_STYLES)))
            count = int(rng.integers(1, 4))
            captions.append([caption(s, first + j) for j in range(count)])
    if task == "zeroshot_retrieval":
        ds.captions = captions
    else:
        ds.labels = np.array([s.label for s in ds.samples], dtype=np.int64)
        ds.prompts = ClassPrompts(list(CLASSNAMES), list(TEMPLATES), "en", "tasks/datasets/shapes.py")
    return ds
