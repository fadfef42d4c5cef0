"""SigLIP 2 NaFlex (transformers' ``siglip2`` model type) with a tiny random Siglip2Model: each image keeps its aspect
ratio through the processor's own resizing into a patch grid, and the model gets pixel_attention_mask and
spatial_shapes; vectors equal a direct transformers call. Its text rule (lowercasing) keys text entries only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.encode.stage import ModelSession, caption_key_fields, image_key_fields
from clipcache.tasks.models.resolve import load_model, resolve_model
from clipcache.tasks.models.spec import ModelSpec

from hf_fixtures import WORDS
from hostile import run_cli

CPU = torch.device("cpu")


def make_naflex(folder):
    from transformers import GemmaTokenizer, Siglip2Config, Siglip2ImageProcessor, Siglip2Model

    folder.mkdir(parents=True)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    words = sorted(set(WORDS))
    for w in [*words, *(w.capitalize() for w in words)]:
        vocab.setdefault(f"\u2581{w}", len(vocab))
    for ch in sorted(set("".join(vocab)) - set("<>")):
        vocab.setdefault(ch, len(vocab))
    torch.manual_seed(0)
    text = {"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 16}
    vision = {"num_patches": 16, "patch_size": 8, "hidden_size": 32, "intermediate_size": 37,
              "num_hidden_layers": 2, "num_attention_heads": 4}
    Siglip2Model(Siglip2Config(text_config=text, vision_config=vision)).save_pretrained(folder)
    GemmaTokenizer(vocab=vocab, merges=[]).save_pretrained(folder)
    Siglip2ImageProcessor(patch_size=8, max_num_patches=16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def naflex(tmp_path_factory):
    return make_naflex(tmp_path_factory.mktemp("siglip2") / "siglip2-naflex")


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)  # a wide, a tall and a square image: three patch grids
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((24, 64), (70, 20),
                                                                                          (33, 33))]


def test_vectors_equal_a_direct_transformers_call(naflex):
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    resolved = resolve_model(ModelSpec(model_name=str(naflex)), FileHashMemo(None))
    model = load_model(resolved, CPU, amp=False)
    module = AutoModel.from_pretrained(naflex).eval()
    images = _images()
    inputs = AutoImageProcessor.from_pretrained(naflex)(images=images, return_tensors="pt")
    assert len({tuple(s) for s in inputs["spatial_shapes"].tolist()}) == 3  # each image its own grid
    assert not inputs["pixel_attention_mask"].all()  # padding patches, masked
    texts = ["A Red Circle on the Left", "blue square"]
    tokens = AutoTokenizer.from_pretrained(naflex)([t.lower() for t in texts], padding="max_length", max_length=16,
                                                  truncation=True, return_tensors="pt")
    with torch.no_grad():
        direct_images = F.normalize(module.get_image_features(**inputs).pooler_output, dim=-1).numpy()
        direct_texts = F.normalize(module.get_text_features(**tokens).pooler_output, dim=-1).numpy()
    ours = model.encode_images(torch.stack([model.image_transform(i) for i in images]))
    np.testing.assert_allclose(ours, direct_images, rtol=0, atol=1e-6)
    np.testing.assert_allclose(model.encode_texts(texts), direct_texts, rtol=0, atol=1e-6)
    # the packed inputs are the processor's, exactly
    from clipcache.tasks.models.hf_model import naflex_inputs

    unpacked = naflex_inputs(torch.stack([model.image_transform(i) for i in images]))
    for name in ("pixel_values", "pixel_attention_mask", "spatial_shapes"):
        assert torch.equal(unpacked[name], inputs[name].to(unpacked[name].dtype)), name


def test_the_lowercasing_keys_text_entries_only(naflex):
    resolved = resolve_model(ModelSpec(model_name=str(naflex)), FileHashMemo(None))
    assert resolved.identity["text_preprocessing"] == {"lowercase": True}
    session = ModelSession(resolved, CPU, amp=False, precision="fp32")
    image = image_key_fields(session, {"d": 1}, "test", None)["model"]
    caption = caption_key_fields(session, {"d": 1}, "test", None)["model"]
    assert "text_preprocessing" not in image and caption["text_preprocessing"] == {"lowercase": True}
    assert image == {k: v for k, v in resolved.identity.items() if k != "text_preprocessing"}


def test_a_naflex_model_evaluates_end_to_end(naflex, tmp_path, monkeypatch, capsys):
    """Through the encode stage (decoding workers pickle the transform; batches stack the packed tensors)."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["eval", "--model", str(naflex), "--dataset", "shapes_retrieval", "--limit", "6",
                            "--num_workers", "1", "--quiet", "--orchestrator", "local", "--output", "r.json"], capsys)
    assert code == 0, err
    metrics = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert all(0.0 <= v <= 1.0 for v in metrics.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_naflex_on_cuda_equals_the_cpu(naflex):
    resolved = resolve_model(ModelSpec(model_name=str(naflex)), FileHashMemo(None))
    cpu, cuda = load_model(resolved, CPU, amp=False), load_model(resolved, torch.device("cuda"), amp=False)
    packed = torch.stack([cpu.image_transform(i) for i in _images()])
    np.testing.assert_allclose(cuda.encode_images(packed), cpu.encode_images(packed), atol=1e-4)
