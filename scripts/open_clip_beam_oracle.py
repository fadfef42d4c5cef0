"""open_clip's own CoCa beam search, for tests/test_captioning_beam.py: run under a transformers 4 (on PYTHONPATH),
which still has the BeamSearchScorer open_clip imports. Usage: MODEL IMAGES.npy OUT.json SEQ_LEN."""

import json
import sys

import numpy as np
import open_clip
import torch
import transformers
from open_clip import coca_model

if not coca_model._has_transformers or getattr(coca_model, "BeamSearchScorer", None) is None:
    sys.exit(f"open_clip cannot run beam search with transformers {transformers.__version__}")
model, _, _ = open_clip.create_model_and_transforms(sys.argv[1], device="cpu")
model.eval()
images = torch.from_numpy(np.load(sys.argv[2]))
with torch.no_grad():
    out = model.generate(images, generation_type="beam_search", seq_len=int(sys.argv[4]))
with open(sys.argv[3], "w") as f:
    json.dump({"transformers": transformers.__version__, "ids": out.tolist()}, f)
