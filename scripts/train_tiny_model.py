"""Train the bundled tiny CLIP on the synthetic shapes ``train`` split (run once; the checkpoint is committed).

    .venv/bin/python scripts/train_tiny_model.py [--steps 3000] [--out tasks/models/assets/tiny-shapes-clip]

The model is a standard open_clip ``CLIP`` (vocabulary 49408, so open_clip's bundled tokenizer works unchanged) saved as
an open_clip ``local-dir:`` folder: ``open_clip_config.json`` + ``open_clip_model.safetensors`` (fp16, a few MB).
Training is seeded, but thread counts change float summation order, so a rerun gives slightly different weights:
ship the checkpoint, don't rebuild it in tests. The shipped one came from the defaults (3,000 steps of 128 pairs
from a pool of 30,000 training images; about 25 minutes on 2 CPU cores); ``--steps 20`` is a smoke test.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import open_clip
import torch
from safetensors.torch import save_file

from clipcache.tasks.datasets import shapes

CONFIG = {
    "model_cfg": {
        "embed_dim": 64,
        "vision_cfg": {"image_size": 64, "layers": 3, "width": 96, "patch_size": 8, "head_width": 32,
                       "mlp_ratio": 2.0},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 3},
    },
    "preprocess_cfg": {
        "mean": list(open_clip.OPENAI_DATASET_MEAN), "std": list(open_clip.OPENAI_DATASET_STD),
        "interpolation": "bicubic", "resize_mode": "shortest",
    },
}


def training_caption(s: shapes.ShapeSample, rng: np.random.Generator) -> str:
    """Half retrieval-style captions, half classification-template prompts, so both tasks are learned."""
    if rng.random() < 0.5:
        return shapes.caption(s, int(rng.integers(len(shapes.CAPTION_STYLES))))
    template = shapes.TEMPLATES[int(rng.integers(len(shapes.TEMPLATES)))]
    return template.format(c=f"{s.colour} {s.shape}")


def make_pool(n: int, mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, list[shapes.ShapeSample]]:
    samples = [shapes.sample_at("train", i)[0] for i in range(n)]
    pixels = np.stack([np.asarray(shapes.render(s)) for s in samples])  # (n, 64, 64, 3) uint8
    images = torch.from_numpy(pixels).permute(0, 3, 1, 2).float().div_(255)
    return (images - mean) / std, samples


def train(out: Path, minutes: float, steps: int | None, batch_size: int, pool_size: int, seed: int) -> dict:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = open_clip.CLIP(**CONFIG["model_cfg"], output_dict=True)
    tokenizer = open_clip.SimpleTokenizer(context_length=CONFIG["model_cfg"]["text_cfg"]["context_length"])
    mean = torch.tensor(CONFIG["preprocess_cfg"]["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(CONFIG["preprocess_cfg"]["std"]).view(1, 3, 1, 1)
    images, samples = make_pool(pool_size, mean, std)
    loss_fn = open_clip.ClipLoss()
    base_lr, warmup = 1e-3, 50
    opt = torch.optim.AdamW(model.parameters(), lr=base_lr, weight_decay=0.05)
    start = time.monotonic()
    step, losses = 0, []
    model.train()

    def progress() -> float:
        return step / steps if steps is not None else (time.monotonic() - start) / (minutes * 60)

    while progress() < 1.0:
        # Linear warm-up, then cosine decay over the step or time budget.
        lr = base_lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(progress(), 1.0)))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = rng.choice(pool_size, size=batch_size, replace=False)
        texts = tokenizer([training_caption(samples[i], rng) for i in idx])
        # Light augmentation: brightness jitter only (flips would contradict the left/right words in captions).
        batch = images[idx] * (1 + 0.1 * torch.randn(batch_size, 1, 1, 1))
        out_ = model(batch, texts)
        loss = loss_fn(out_["image_features"], out_["text_features"], out_["logit_scale"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, 4.6052)
        losses.append(float(loss.detach()))
        step += 1
        if step % 50 == 0:
            print(f"step {step} lr {lr:.2e} loss {np.mean(losses[-50:]):.4f}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "open_clip_model.safetensors"))
    (out / "open_clip_config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    info = {"steps": step, "batch_size": batch_size, "pool_size": pool_size, "seed": seed,
            "final_loss": float(np.mean(losses[-50:])) if losses else None,
            "parameters": sum(p.numel() for p in model.parameters())}
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("tasks/models/assets/tiny-shapes-clip"))
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps (the learning rate follows them)")
    parser.add_argument("--minutes", type=float, default=None, help="train for this long instead of --steps")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--pool_size", type=int, default=30000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    steps = None if args.minutes is not None else args.steps
    info = train(args.out, args.minutes or 0.0, steps, args.batch_size, args.pool_size, args.seed)
    (args.out / "TRAINING.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
