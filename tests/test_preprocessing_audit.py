"""Each built-in model family's text and image preprocessing against its reference (docs/preprocessing.md): the
loader's tokens and pixels equal those of the family's own processor called as its reference calls it, SigLIP 2's
texts are lowercased as big_vision does, and that text rule is in the model's identity only where it applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.resolve import load_model, resolve_model
from clipcache.tasks.models.spec import ModelSpec

from hf_fixtures import WORDS, make_hf_model

CPU = torch.device("cpu")
TEXTS = ["A Red Circle on the Left", "a photo of a blue square.", "GREEN triangle,   at the   top",
         " ".join(["red circle"] * 40)]  # the last one longer than every context: truncation


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((40, 56), (64, 48))]


def make_siglip2(folder):
    """A fixed-resolution SigLIP 2 checkpoint as google/siglip2-*-patch16-224 ship it: model type ``siglip`` with
    SigLIP 2's Gemma tokenizer (case-sensitive, its vocabulary holds both cases)."""
    from transformers import GemmaTokenizer, SiglipConfig, SiglipImageProcessor, SiglipModel

    folder.mkdir(parents=True)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    words = sorted(set(WORDS))
    for w in [*words, *(w.capitalize() for w in words), *(w.upper() for w in words)]:
        vocab.setdefault(f"\u2581{w}", len(vocab))
    for ch in sorted(set("".join(vocab)) - set("<>")):
        vocab.setdefault(ch, len(vocab))
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[])
    torch.manual_seed(0)
    text = {"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 16}
    vision = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
              "num_attention_heads": 4}
    SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    made = {kind: make_hf_model(root / kind, kind) for kind in ("clip", "chinese_clip", "siglip")}
    made["siglip2"] = make_siglip2(root / "siglip2")
    return made


def _loaded(folder):
    memo = FileHashMemo(None)
    resolved = resolve_model(ModelSpec(model_name=str(folder)), memo)
    return resolved, load_model(resolved, CPU, amp=False)


def test_siglip2_texts_are_lowercased_as_big_vision_does(folders):
    """big_vision's SigLIP 2 preprocessing lowercases, then tokenizes to a fixed 64 (here the tiny model's 16)
    tokens; transformers' Gemma tokenizer keeps case, so the loader lowercases: its tokens are the reference
    processor's on the lowercased texts, padding="max_length" (HF's documented SigLIP 2 usage)."""
    from transformers import AutoTokenizer

    resolved, model = _loaded(folders["siglip2"])
    reference = AutoTokenizer.from_pretrained(folders["siglip2"])
    expected = reference([t.lower() for t in TEXTS], padding="max_length", truncation=True, max_length=16,
                         return_tensors="pt")
    ours = model.tokenize(TEXTS)
    assert torch.equal(ours["input_ids"], expected["input_ids"])
    assert ours["input_ids"].shape == (len(TEXTS), 16)
    cased = reference(TEXTS, padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    assert not torch.equal(ours["input_ids"], cased["input_ids"])  # the case mattered to this tokenizer
    np.testing.assert_array_equal(model.encode_texts(["A Red Circle"]), model.encode_texts(["a red circle"]))


def test_the_text_rule_is_in_the_identity_only_where_it_applies(folders):
    """SigLIP 2 (a folder with its Gemma tokenizer, or a hub id naming siglip2) records its lowercasing; every other
    family's identity holds no text rule, so its cache keys (image and text) are what they were."""
    memo = FileHashMemo(None)
    rule = {"lowercase": True}
    assert resolve_model(ModelSpec(model_name=str(folders["siglip2"])), memo).identity["text_preprocessing"] == rule
    for kind in ("clip", "chinese_clip", "siglip"):
        assert "text_preprocessing" not in resolve_model(ModelSpec(model_name=str(folders[kind])), memo).identity
    hub = {name: resolve_model(ModelSpec(model_name=name), memo).identity
           for name in ("google/siglip2-base-patch16-224", "google/siglip-base-patch16-224",
                        "openai/clip-vit-base-patch32")}
    assert hub["google/siglip2-base-patch16-224"]["text_preprocessing"] == rule
    assert all("text_preprocessing" not in hub[n] for n in ("google/siglip-base-patch16-224",
                                                             "openai/clip-vit-base-patch32"))
    assert hub["openai/clip-vit-base-patch32"] == {"loader": "hf", "library": hub["openai/clip-vit-base-patch32"][
        "library"], "hf_hub": "openai/clip-vit-base-patch32", "revision": "main"}  # unchanged keys


@pytest.mark.parametrize("kind, padding", [("clip", True), ("chinese_clip", True), ("siglip", "max_length")])
def test_hf_tokens_and_pixels_are_the_reference_processors(folders, kind, padding):
    """CLIP and Chinese-CLIP as mteb's CLIP wrapper and evalscope call the processor (padding=True, truncation);
    SigLIP as mteb's SigLIP wrapper (padding="max_length"); the truncation length is the text tower's
    max_position_embeddings. Pixels: the folder's own image processor, unchanged."""
    from transformers import AutoImageProcessor, AutoTokenizer

    _, model = _loaded(folders[kind])
    tokenizer = AutoTokenizer.from_pretrained(folders[kind])
    expected = tokenizer(TEXTS, padding=padding, truncation=True, max_length=model.max_length, return_tensors="pt")
    ours = model.tokenize(TEXTS)
    assert set(ours) == set(expected)
    for name in ours:
        assert torch.equal(ours[name], expected[name]), name
    processor = AutoImageProcessor.from_pretrained(folders[kind])
    for image in _images():
        assert torch.equal(model.image_transform(image), processor(images=image, return_tensors="pt")
                           ["pixel_values"][0])


def test_open_clip_tokens_and_pixels_are_open_clips_own():
    """open_clip models use open_clip's tokenizer (ftfy, whitespace clean, lowercase, the config's context length)
    and its eval transform from the model's preprocess_cfg (resize mode, interpolation, mean / std)."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2

    resolved, model = _loaded("tiny-shapes-clip")
    name = resolved.source
    tokens = model.tokenize(TEXTS)
    assert torch.equal(tokens, open_clip.get_tokenizer(name)(TEXTS)) and tokens.shape == (len(TEXTS), 32)
    assert torch.equal(model.tokenize(["A  RED Circle"]), model.tokenize(["a red circle"]))  # lowercased, cleaned
    config = open_clip.get_model_config(name) or {}
    import json
    from pathlib import Path

    folder = Path(name.removeprefix("local-dir:"))
    cfg = json.loads((folder / "open_clip_config.json").read_text())["preprocess_cfg"]
    reference = image_transform_v2(PreprocessCfg(size=64, **cfg), is_train=False)
    assert cfg["resize_mode"] == "shortest" and cfg["interpolation"] == "bicubic" and config is not None
    for image in _images():
        assert torch.equal(model.image_transform(image), reference(image))
