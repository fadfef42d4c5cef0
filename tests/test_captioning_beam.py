"""clipcache's CoCa beam search (tasks/evaluation/caption_beam_search.py) against open_clip's own, which needs
transformers 4's BeamSearchScorer: token for token on a tiny random CoCa, and on one whose <end_of_text> competes
with a frequent token (captions end early, hypotheses finish at different lengths).

Opt-in (transformers 4 cannot be installed beside clipcache's transformers 5): install it into a folder of its own
and name it, e.g.

    pip install --target /tmp/tf4 --no-deps transformers==4.46.3 tokenizers==0.20.3 huggingface_hub==0.26.5
    CLIPCACHE_TRANSFORMERS4=/tmp/tf4 pytest tests/test_captioning_beam.py

open_clip's beam search then runs in a subprocess with that folder first on its path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_captioning import write_tiny_coca

from conftest import REPO

TF4 = os.environ.get("CLIPCACHE_TRANSFORMERS4")
pytestmark = pytest.mark.skipif(not TF4, reason="set CLIPCACHE_TRANSFORMERS4 to a folder with transformers 4.x")


@pytest.mark.parametrize("eot_like", [None, 1.05])
def test_beam_search_equals_open_clips_under_transformers_4(tmp_path, eot_like):
    import open_clip
    import torch
    from safetensors.torch import load_file, save_file

    from clipcache.tasks.evaluation.caption_beam_search import EOT, beam_search

    spec = write_tiny_coca(tmp_path / "coca")
    if eot_like is not None:  # <end_of_text>'s output column a scaled copy of a token the model writes often
        weights = load_file(tmp_path / "coca" / "open_clip_model.safetensors")
        projection = weights["text_decoder.text_projection"]
        projection[:, EOT] = projection[:, 19702] * eot_like
        save_file(weights, tmp_path / "coca" / "open_clip_model.safetensors")
    model, _, _ = open_clip.create_model_and_transforms(spec, device="cpu")
    model.eval()
    images = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    for seq_len in (8, 30):
        subprocess.run([sys.executable, str(REPO / "scripts" / "open_clip_beam_oracle.py"), spec,
                        str(tmp_path / "images.npy"), str(tmp_path / "oracle.json"), str(seq_len)],
                       env={**os.environ, "PYTHONPATH": TF4}, check=True, timeout=600)
        oracle = json.loads(Path(tmp_path / "oracle.json").read_text())
        assert oracle["transformers"].startswith("4.")
        with torch.no_grad():
            ours = beam_search(model, torch.from_numpy(images), seq_len=seq_len).tolist()
        assert ours == oracle["ids"], seq_len
