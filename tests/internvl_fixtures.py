"""A tiny, randomly initialised InternVL folder laid out as OpenGVLab/InternVL-14B-224px's Hugging Face folder is:
config.json whose auto_map points at the folder's own configuration_internvl.py / modeling_internvl.py (written for
these tests to InternVL-C/G's documented interface: tests/fixtures/tiny_internvl), safetensors weights, a Llama
tokenizer (transformers 5's LlamaTokenizer with byte fallback, so any language encodes) and a CLIPImageProcessor with
InternVL's ImageNet mean/std and bicubic resizing."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import torch

CODE = Path(__file__).parent / "fixtures" / "tiny_internvl"
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _tokenizer():
    from transformers import LlamaTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):  # byte fallback: a character outside the vocabulary becomes its UTF-8 bytes
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for piece in ["▁", *string.ascii_letters, *string.digits, *":.,'-[]()"]:
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "a"), ("▁", "p"), ("s", "u"), ("o", "t"), ("▁", "o")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return LlamaTokenizer(vocab=vocab, merges=merges), len(vocab)


def make_internvl_folder(folder: Path, seed: int = 0) -> Path:
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModel, CLIPImageProcessor

    folder.mkdir(parents=True, exist_ok=True)
    for file in CODE.glob("*.py"):
        shutil.copy(file, folder / file.name)
    tokenizer, vocab_size = _tokenizer()
    config = {"model_type": "internvl", "architectures": ["TinyInternVLModel"], "vocab_size": vocab_size,
              "hidden_size": 16, "clip_embed_dim": 12, "image_size": 32, "patch_size": 8,
              "auto_map": {"AutoConfig": "configuration_internvl.TinyInternVLConfig",
                           "AutoModel": "modeling_internvl.TinyInternVLModel"}}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    torch.manual_seed(seed)
    model = AutoModel.from_config(AutoConfig.from_pretrained(folder, trust_remote_code=True), trust_remote_code=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
    # as a LLaMA tokenizer_config.json saved by the slow tokenizer says: BOS added, EOS only when asked
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**saved, "add_bos_token": True, "add_eos_token": False}))
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, resample=3,
                       image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD).save_pretrained(folder)
    return folder


def fork_retrieval_wiring(folder: str | Path, mode: str):
    """(model, tokenize, image transform) for InternVL's retrieval models as its clip_benchmark fork wires them,
    for LAION clip_benchmark's ``zeroshot_retrieval.evaluate``: ``encode_image`` in ``mode``, ``encode_text``, the
    ``summarize:`` prefix with the slow tokenizer padded with 0 to 80 tokens, and the square resize (no crop)."""
    from transformers import AutoModel, AutoTokenizer, CLIPImageProcessor

    module = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    processor = CLIPImageProcessor.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, use_fast=False, add_bos_token=True, add_eos_token=True,
                                              padding_side="right")
    tokenizer.pad_token_id = 0

    class Fork(torch.nn.Module):
        def encode_image(self, image):
            return module.encode_image(image, mode=mode)

        def encode_text(self, text):
            return module.encode_text(text)

    def tokenize(texts):
        return tokenizer(["summarize:" + t for t in texts], return_tensors="pt", max_length=80, truncation=True,
                         padding="max_length").input_ids

    def transform(image):
        return processor(images=image.convert("RGB"), return_tensors="pt", do_center_crop=False,
                         size={"height": 32, "width": 32}).pixel_values[0]

    return Fork(), tokenize, transform
