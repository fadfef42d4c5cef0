"""Tiny, randomly initialised Hugging Face CLIP-family models saved to local folders (the real classes and files)."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ("a photo of the drawing picture on plain background there is small large left right top bottom center "
         "red green blue yellow purple orange circle square triangle diamond cross white black gray over").split()


def _bert_tokenizer(folder: Path):
    from transformers import BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + sorted(set(WORDS))
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n")
    return BertTokenizer(str(vocab_file)), len(vocab)


def make_hf_model(folder: Path, kind: str) -> Path:
    """kind: clip | chinese_clip | siglip."""
    from transformers import (
        ChineseCLIPConfig,
        ChineseCLIPImageProcessor,
        ChineseCLIPModel,
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        SiglipConfig,
        SiglipImageProcessor,
        SiglipModel,
    )

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer, vocab_size = _bert_tokenizer(folder)
    torch.manual_seed(0)
    vision = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 37,
              "num_hidden_layers": 2, "num_attention_heads": 4}
    text = {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 24}
    if kind == "clip":
        # pool at the first [SEP]: CLIP's text tower takes the eos position from eos_token_id
        text.update(bos_token_id=2, eos_token_id=3, pad_token_id=0)
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
        processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    elif kind == "chinese_clip":
        text["max_position_embeddings"] = 40
        model = ChineseCLIPModel(ChineseCLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
        processor = ChineseCLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    elif kind == "siglip":
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
        processor = SiglipImageProcessor(size={"height": 32, "width": 32})
    else:
        raise ValueError(kind)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
