"""Datasets that misbehave on purpose, for tests/test_input_pipeline.py. They live in a module of their own because
decoding worker processes unpickle them, and so import this module: it must import nothing heavy (no pytest, no
Prefect, no torch)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from PIL import Image

from clipcache.tasks.datasets.shapes import ShapesDataset


@dataclass
class SlowFirstBatch(ShapesDataset):
    """The first ``slow`` images take a while, so later batches finish first in other workers."""

    slow: int = 0

    def load_image(self, index: int) -> Image.Image:
        if index < self.slow:
            time.sleep(0.05)
        return super().load_image(index)


@dataclass
class DiesAt(ShapesDataset):
    """The process decoding image ``fatal`` is killed (as the OOM killer would)."""

    fatal: int = -1

    def load_image(self, index: int) -> Image.Image:
        if index == self.fatal:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().load_image(index)
