"""Shared prompt cache: 5 classification datasets sharing 100 class names x 20 templates.

    .venv/bin/python benchmarks/prompt_sharing.py

Counts the class prompts that needed a text forward pass when the 5 datasets are evaluated one after another with
the bundled model: without sharing each dataset would encode 100 x 20 = 2,000 prompts (10,000 in all); with the
content-addressed prompt pool the first dataset encodes 2,000 and the other four none. Then a 21st template is added:
only its 100 new prompts are encoded. Also prints the time each step took.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402
from clipcache.storage.hashing import FileHashMemo  # noqa: E402
from clipcache.tasks.encode.stage import ModelSession, encode_prompts  # noqa: E402
from clipcache.tasks.models.resolve import resolve_model  # noqa: E402
from clipcache.tasks.models.spec import ModelSpec  # noqa: E402
from clipcache.tasks.progress import StageProgress  # noqa: E402

COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black", "gray", "pink"]
THINGS = ["circle", "square", "triangle", "diamond", "cross", "star", "ring", "arrow", "heart", "moon"]
CLASSNAMES = [f"{c} {t}" for c in COLOURS for t in THINGS]
TEMPLATES = [f"{prefix} {{c}}{suffix}" for prefix in ("a photo of a", "a drawing of a", "a picture of a", "a",
                                                        "an image of a")
             for suffix in (".", " on a plain background.", ", small.", ", large.")]


def main() -> None:
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)),
                           torch.device("cpu"), False, "fp32")
    quiet = StageProgress(enabled=False)
    prompts = [t.format(c=c) for c in CLASSNAMES for t in TEMPLATES]
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = EmbeddingStore(tmp)
        print(f"{len(CLASSNAMES)} class names x {len(TEMPLATES)} templates = {len(prompts):,} prompts per dataset")
        for d in range(5):
            start = time.perf_counter()
            out = encode_prompts(session, prompts, store, 256, quiet, f"dataset{d}")
            total += out.encoded
            print(f"dataset {d + 1}: {out.encoded:5,} prompts encoded ({time.perf_counter() - start:.2f} s)")
        extra = prompts + [f"a blurry photo of a {c}." for c in CLASSNAMES]
        out = encode_prompts(session, extra, store, 256, quiet, "dataset5+template")
        print(f"dataset 1 with a 21st template: {out.encoded} prompts encoded")
    print(f"text forward passes: {total:,} with the shared cache vs {5 * len(prompts):,} without "
          f"({5 * len(prompts) / total:.0f}x fewer)")


if __name__ == "__main__":
    main()
