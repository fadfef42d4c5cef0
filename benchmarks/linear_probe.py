"""A linear probe, clipcache against LAION clip_benchmark's own probe code, side by side in one run.

    .venv/bin/python benchmarks/linear_probe.py [--model tiny-shapes-clip | ViT-B-32] [--train 1200] [--val 300]
                                                [--test 600] [--batch_size 64]

A 30-class classification dataset of generated shapes images in the webdataset layout with train, val and test
splits, read by both tools from the same folder; the same weights (the bundled tiny model, or an open_clip
architecture with random seeded weights saved once to a checkpoint both load), fp32, on the CPU.

- first run: encode train, val and test, sweep the weight decay on val (clip_benchmark's 97-point grid search),
  train the final probe on train + val, test;
- second run with other settings (another learning rate: a new weight-decay sweep): clip_benchmark re-reads its
  feature dump (``feature_root``); clipcache rescores from its cache.

clip_benchmark's probe asserts CUDA; it runs here as its own ``linear_probe.evaluate`` with ``.cuda()`` made the
identity (the same swap tests/test_linear_probe.py makes), on data loaders built as its CLI builds them. Both sides
run in this process, one after the other; their lp_acc1 / lp_acc5 / lp_mean_per_class_recall are printed side by
side with the largest difference.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SPLITS = {"train": "train", "val": "train", "test": "test"}  # the shapes split each benchmark split draws from


def write_probe_wds(root: Path, sizes: dict[str, int]) -> None:
    from clipcache.tasks.datasets.shapes import CLASSNAMES, TEMPLATES, load_shapes

    root.mkdir(parents=True)
    (root / "classnames.txt").write_text("\n".join(CLASSNAMES) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("\n".join(TEMPLATES) + "\n")
    train = load_shapes("bench", "zeroshot_classification", "train", None, size=sizes["train"] + sizes["val"])
    test = load_shapes("bench", "zeroshot_classification", "test", None, size=sizes["test"])
    ranges = {"train": (train, 0, sizes["train"]), "val": (train, sizes["train"], sizes["train"] + sizes["val"]),
              "test": (test, 0, sizes["test"])}
    for split, (ds, lo, hi) in ranges.items():
        (root / split).mkdir()
        with tarfile.open(root / split / "0.tar", "w") as tar:
            for i in range(lo, hi):
                buf = io.BytesIO()
                ds.load_image(i).save(buf, format="PNG")
                for name, data in ((f"{i:06d}.png", buf.getvalue()), (f"{i:06d}.cls", str(int(ds.labels[i])).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        (root / split / "nshards.txt").write_text("1")


class CpuAsCuda(str):
    """"cpu" for torch, equal to "cuda" for clip_benchmark's `assert device == 'cuda'`."""

    def __eq__(self, other: object) -> bool:
        return other == "cuda" or str.__eq__(self, other)

    __hash__ = str.__hash__


def peer(model_name: str, pretrained: str | None, root: Path, features: Path, batch_size: int, lr: float,
         epochs: int, seed: int) -> tuple[float, dict]:
    """clip_benchmark's probe as its CLI runs it (wds datasets, its loaders), `.cuda()` the identity."""
    import open_clip
    from clip_benchmark.datasets.builder import build_dataset
    from clip_benchmark.metrics import linear_probe as cb

    started = time.perf_counter()
    tensor_cuda, module_cuda, infer = getattr(torch.Tensor, "cuda", None), torch.nn.Module.cuda, cb.infer
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    cb.infer = lambda model, loader, amp, device: infer(model, loader, amp, "cpu")
    try:
        model, _, transform = open_clip.create_model_and_transforms(model_name, pretrained=pretrained, device="cpu")
        model.eval()

        def loader(split: str) -> torch.utils.data.DataLoader:
            ds = build_dataset(dataset_name="wds/probe", root=str(root), transform=transform, split=split,
                               download=False, task="linear_probe")
            if split == "test":
                return torch.utils.data.DataLoader(ds.batched(batch_size), batch_size=None, shuffle=False,
                                                   num_workers=1)
            return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=1)

        torch.manual_seed(seed)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            metrics = cb.evaluate(model, loader("train"), loader("test"), -1, batch_size, 1, lr, epochs, "probe", seed,
                                  str(features), CpuAsCuda("cpu"), val_dataloader=loader("val"), normalize=True,
                                  amp=False)
    finally:
        torch.Tensor.cuda = tensor_cuda  # type: ignore[method-assign]
        torch.nn.Module.cuda = module_cuda  # type: ignore[method-assign]
        cb.infer = infer
    return time.perf_counter() - started, metrics


def ours(model_name: str, pretrained: str | None, root: Path, cache: Path, batch_size: int, lr: float, epochs: int,
         seed: int, cached_only: bool) -> tuple[float, dict, int]:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.encode.stage import ModelSession
    from clipcache.tasks.evaluation import evaluate_one
    from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, ScoreSettings
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec

    started = time.perf_counter()
    memo = FileHashMemo(None)
    spec = ModelSpec(model_name=model_name, pretrained=pretrained)
    session = ModelSession(resolve_model(spec, memo), torch.device("cpu"), amp=False, precision="fp32")
    scored = evaluate_one("linear_probe", session, DataSource("wds/probe", str(root)), EmbeddingStore(cache), memo,
                          encode=EncodeSettings(batch_size, 2, cached_only=cached_only),
                          score=ScoreSettings(batch_size=batch_size),
                          options={"batch_size": batch_size, "val_split": "val", "fewshot_lr": lr,
                                   "fewshot_epochs": epochs, "seed": seed})
    return time.perf_counter() - started, scored.metrics, session.loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-shapes-clip")
    parser.add_argument("--train", type=int, default=1200)
    parser.add_argument("--val", type=int, default=300)
    parser.add_argument("--test", type=int, default=600)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    logging.disable(logging.INFO)  # clip_benchmark logs every training step
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = work / "probe"
        write_probe_wds(root, {"train": args.train, "val": args.val, "test": args.test})
        if args.model == "tiny-shapes-clip":
            ours_model, ours_pretrained = "tiny-shapes-clip", None
            peer_model, peer_pretrained = f"local-dir:{REPO / 'tasks' / 'models' / 'assets' / 'tiny-shapes-clip'}", None
        else:
            import open_clip

            torch.manual_seed(0)
            ckpt = work / "weights.pt"
            torch.save(open_clip.create_model(args.model).state_dict(), ckpt)
            ours_model, ours_pretrained = args.model, str(ckpt)
            peer_model, peer_pretrained = args.model, str(ckpt)
        print(f"linear probe, {args.model}, fp32 CPU: train {args.train}, val {args.val}, test {args.test} images, "
              f"30 classes, batch {args.batch_size}, {args.epochs} epochs, weight decay swept on val")
        rows = []
        for label, lr in (("first run (encode + probe)", 0.1), ("second run (other lr: new sweep)", 0.05)):
            p_time, p_metrics = peer(peer_model, peer_pretrained, root, work / "features", args.batch_size, lr,
                                     args.epochs, 0)
            o_time, o_metrics, loads = ours(ours_model, ours_pretrained, root, work / "cache", args.batch_size, lr,
                                            args.epochs, 0, cached_only=lr != 0.1)
            common = sorted(k for k in p_metrics if k in o_metrics)
            diff = max(abs(o_metrics[k] - p_metrics[k]) for k in common)
            rows.append((label, p_time, o_time))
            print(f"  {label}: clip_benchmark {p_time:6.1f} s, clipcache {o_time:6.1f} s -> "
                  f"{p_time / o_time:.2f}x clip_benchmark's speed; model loaded by clipcache: {bool(loads)}")
            print("    " + ", ".join(f"{k} {p_metrics[k]:.4f} / {o_metrics[k]:.4f}" for k in common) +
                  f"  (clip_benchmark / clipcache; largest difference {diff:.4f}; clip_benchmark's weight decay "
                  f"{p_metrics.get('weight_decay', float('nan')):.2e})")


if __name__ == "__main__":
    main()
