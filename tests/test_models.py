"""Model loaders on real (tiny, local) open_clip and Hugging Face models; identities; clear errors."""

from __future__ import annotations

import json

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F

from clipcache.storage.errors import ModelError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.resolve import load_model, resolve_model
from clipcache.tasks.models.spec import ModelSpec

from hf_fixtures import make_hf_model

CPU = torch.device("cpu")
TINY_ARCH = {"embed_dim": 16,
             "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
             "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


@pytest.fixture
def memo(tmp_path):
    return FileHashMemo(tmp_path / "memo.json")


def images(n=3):
    from clipcache.tasks.datasets.shapes import load_shapes

    ds = load_shapes("x", "zeroshot_classification", "test", n)
    return [ds.load_image(i) for i in range(n)]


def encode_both(model, texts=("a red circle", "a blue square")):
    pixels = torch.stack([model.image_transform(img) for img in images()])
    return model.encode_images(pixels), model.encode_texts(list(texts))


def test_bundled_model_goes_through_the_open_clip_local_dir_loader(memo, tiny_model_dir):
    resolved = resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo)
    assert resolved.loader == "open_clip" and resolved.source == f"local-dir:{tiny_model_dir}"
    img, txt = encode_both(load_model(resolved, CPU, amp=False))
    assert img.shape == (3, 64) and txt.shape == (2, 64) and img.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(img, axis=1), 1, rtol=1e-5)
    # identical to calling open_clip directly
    ref, _, pre = open_clip.create_model_and_transforms(f"local-dir:{tiny_model_dir}")
    with torch.no_grad():
        expected = F.normalize(ref.eval().encode_image(torch.stack([pre(i) for i in images()])), dim=-1).numpy()
    np.testing.assert_array_equal(img, expected)


def test_arch_config_random_init_is_reproducible(tmp_path, memo):
    cfg = tmp_path / "Tiny-Test-Arch.json"
    cfg.write_text(json.dumps(TINY_ARCH))
    spec = ModelSpec(model_name="Tiny-Test-Arch", arch_config=str(cfg))
    resolved = resolve_model(spec, memo)
    assert resolved.identity["weights"] == "random-init-seed-0"
    a = encode_both(load_model(resolved, CPU, False))
    b = encode_both(load_model(resolved, CPU, False))
    np.testing.assert_array_equal(a[0], b[0])


def test_checkpoint_file_is_content_hashed(tmp_path, memo):
    cfg = tmp_path / "Tiny-Ckpt-Arch.json"
    cfg.write_text(json.dumps(TINY_ARCH))
    open_clip.add_model_config(cfg)
    ckpt = tmp_path / "weights.pt"
    torch.manual_seed(3)
    torch.save(open_clip.create_model("Tiny-Ckpt-Arch").state_dict(), ckpt)
    resolved = resolve_model(ModelSpec(model_name="Tiny-Ckpt-Arch", pretrained=str(ckpt)), memo)
    assert len(resolved.identity["weights"]) == 64
    encode_both(load_model(resolved, CPU, False))
    torch.save({k: v + 1 for k, v in torch.load(ckpt).items()}, ckpt)
    assert resolve_model(ModelSpec(model_name="Tiny-Ckpt-Arch", pretrained=str(ckpt)), memo).identity != \
        resolved.identity


@pytest.mark.parametrize("kind", ["clip", "chinese_clip", "siglip"])
def test_hugging_face_models_from_local_folders(tmp_path, memo, kind):
    folder = make_hf_model(tmp_path / kind, kind)
    resolved = resolve_model(ModelSpec(model_name=str(folder)), memo)
    assert resolved.loader == "hf"
    # a folder is shown by its name and a prefix of its content hash, as a weights file is
    assert resolved.checkpoint_label == f"{kind}@{resolved.checkpoint.removeprefix('sha256:')[:8]}"
    model = load_model(resolved, CPU, amp=False)
    img, txt = encode_both(model)
    assert img.shape == (3, 16 if kind != "siglip" else 32) and txt.shape[0] == 2
    np.testing.assert_allclose(np.linalg.norm(txt, axis=1), 1, rtol=1e-5)
    # Same vectors as calling transformers directly.
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    ref = AutoModel.from_pretrained(folder).eval()
    proc, tok = AutoImageProcessor.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    padding = "max_length" if kind == "siglip" else True
    with torch.no_grad():
        out = ref.get_image_features(pixel_values=proc(images=images(), return_tensors="pt")["pixel_values"])
        out = out if isinstance(out, torch.Tensor) else out.pooler_output
        t = tok(["a red circle", "a blue square"], padding=padding, max_length=model.max_length, truncation=True,
                return_tensors="pt")
        tout = ref.get_text_features(**t)
        tout = tout if isinstance(tout, torch.Tensor) else tout.pooler_output
    np.testing.assert_allclose(img, F.normalize(out, dim=-1).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(txt, F.normalize(tout, dim=-1).numpy(), rtol=1e-5, atol=1e-6)


def test_amp_runs_in_bfloat16_on_cpu(memo):
    model = load_model(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), CPU, amp=True)
    img, _ = encode_both(model)
    fp32 = encode_both(load_model(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), CPU, False))[0]
    assert img.dtype == np.float32 and not np.array_equal(img, fp32)
    np.testing.assert_allclose(img, fp32, atol=0.05)


def test_unknown_names_suggest_close_ones(memo):
    with pytest.raises(ModelError, match="Did you mean: .*ViT-B-32"):
        resolve_model(ModelSpec(model_name="ViT-B-3"), memo)
    with pytest.raises(ModelError, match="Did you mean: tiny-shapes-clip"):
        resolve_model(ModelSpec(model_name="tiny-shapes-clp"), memo)
    with pytest.raises(ModelError, match="neither a file nor a known tag"):
        resolve_model(ModelSpec(model_name="ViT-B-32", pretrained="laion2b_s34b_b79kk"), memo)


def test_local_dir_without_config_or_weights(tmp_path, memo):
    with pytest.raises(ModelError, match="open_clip_config.json"):
        resolve_model(ModelSpec(model_name=f"local-dir:{tmp_path}"), memo)
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_ARCH}))
    with pytest.raises(ModelError, match="no weights file"):
        resolve_model(ModelSpec(model_name=f"local-dir:{tmp_path}"), memo)


def test_hub_ids_fail_cleanly_offline(memo):
    # HF_HUB_OFFLINE=1 and MODELSCOPE_ENDPOINT=http://127.0.0.1:9 (conftest): nothing leaves this machine.
    resolved = resolve_model(ModelSpec(model_name="openai/clip-vit-base-patch32"), memo)
    assert resolved.loader == "hf" and resolved.identity["hf_hub"] == "openai/clip-vit-base-patch32"
    with pytest.raises(ModelError, match="openai/clip-vit-base-patch32"):
        load_model(resolved, CPU, False)
    with pytest.raises(ModelError, match="from ModelScope"):
        resolve_model(ModelSpec(model_name="AI-ModelScope/chinese-clip-vit-large-patch14-336px",
                                model_type="modelscope"), memo)


@pytest.mark.parametrize("has_bf16, precision", [("0", "fp32"), ("1", "amp_bf16")])
def test_amp_on_a_cpu_without_bf16_runs_fp32_and_says_so(has_bf16, precision, tmp_path, monkeypatch, capsys):
    import json
    import logging

    from clipcache.flows.cli import main

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines: list[str] = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    seen = Lines()
    logging.getLogger("clipcache").addHandler(seen)  # the CLI's own handler prints the same line on stderr
    monkeypatch.setenv("CLIPCACHE_CPU_BF16", has_bf16)
    try:
        assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "30", "--amp",
                     "--quiet", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]) == 0
    finally:
        logging.getLogger("clipcache").removeHandler(seen)
    assert any("no bfloat16 instructions" in line for line in seen.lines) == (has_bf16 == "0"), seen.lines
    [result] = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("shapes_zeroshot_classification*.json")]
    assert result["experiment"]["precision"] == precision
