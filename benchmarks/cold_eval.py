"""A cold evaluation (empty cache, fresh processes), clipcache against clip_benchmark, side by side in one run.

    .venv/bin/python benchmarks/cold_eval.py [--model ViT-B-32] [--distinct-images 300] [--shared-images 600]
                                             [--only shared] [--variants fp32,amp]

Two retrieval datasets of generated shapes images in the webdataset layout, read by both tools from the same folder:

- "distinct": every caption is different (a caption names the image's attributes and its number), so nothing can
  be shared: clipcache must match clip_benchmark's speed, which is about that of a plain encode loop;
- "shared": captions from a few templates over the attributes, so most texts repeat (as in COCO / Flickr, more so in
  templated sets): clipcache encodes each distinct text once.

The model is an open_clip architecture with random weights, saved once to a checkpoint file that both tools load
(`--pretrained FILE`), fp32 (clip_benchmark `--no_amp`). Each tool runs as its own CLI process under
`/usr/bin/time` (wall time and peak RSS); their recall@1/5/10 are compared. clipcache runs as it does by default
(fp32: each distinct text once) and with `--amp` (bf16 autocast on the CPU); the largest recall@k difference to the
peer is printed. With ``--parity`` clip_benchmark also runs with ``--num_workers 0``: its webdataset loader then
batches images in dataset order, as clipcache does, and the recall@k of both are compared with that run too.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TEMPLATES = ["a {colour} {shape}.", "a photo of a {colour} {shape}.", "a {size} {colour} {shape} {where}."]


def write_dataset(root: Path, n: int, distinct: bool, per_image: int = 3, shards: int = 2) -> int:
    """The webdataset retrieval layout; returns the number of distinct caption texts."""
    sys.path.insert(0, str(REPO))
    from clipcache.tasks.datasets.shapes import POSITION_WORDS, load_shapes

    ds = load_shapes("bench", "zeroshot_retrieval", "test", n)
    (root / "test").mkdir(parents=True)
    texts: set[str] = set()
    per_shard = -(-n // shards)
    for s in range(shards):
        with tarfile.open(root / "test" / f"{s}.tar", "w") as tar:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                sample = ds.samples[i]
                words = {"colour": sample.colour, "shape": sample.shape, "size": sample.size,
                         "where": POSITION_WORDS[sample.position]}
                captions = [t.format(**words) + (f" Picture {i}, view {j}." if distinct else "")
                            for j, t in enumerate(TEMPLATES[:per_image])]
                texts.update(captions)
                buf = io.BytesIO()
                ds.load_image(i).save(buf, format="PNG")
                for name, data in ((f"{i:06d}.png", buf.getvalue()), (f"{i:06d}.txt", "\n".join(captions).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    (root / "test" / "nshards.txt").write_text(str(shards))
    (root / "dataset_type.txt").write_text("retrieval")
    return len(texts)


def checkpoint(model: str, path: Path) -> None:
    import open_clip
    import torch

    torch.manual_seed(0)
    torch.save(open_clip.create_model(model).state_dict(), path)


def timed(command: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in GB) of one process."""
    out = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    seconds, kb = out.stderr.strip().splitlines()[-1].split()
    return float(seconds), int(kb) / 1024**2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--distinct-images", type=int, default=300)
    parser.add_argument("--shared-images", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--only", choices=["distinct", "shared"], default=None, help="run one of the two datasets")
    parser.add_argument("--variants", default="fp32,amp", help="clipcache runs: fp32, amp (--amp)")
    parser.add_argument("--parity", action="store_true",
                        help="also run clip_benchmark with --num_workers 0 (its images then batched in dataset order, "
                             "as clipcache batches them) and compare recall@k with that run too")
    args = parser.parse_args()
    variants = {"fp32": [], "amp": ["--amp"]}
    chosen = [v for v in args.variants.split(",") if v]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = work / f"{args.model}-random.pt"
        checkpoint(args.model, ckpt)
        for label, n, distinct in (("distinct", args.distinct_images, True), ("shared", args.shared_images, False)):
            if args.only and label != args.only:
                continue
            root = work / label
            n_texts = write_dataset(root, n, distinct)
            common = ["--dataset", f"wds/{label}", "--dataset_root", str(root), "--batch_size", str(args.batch_size),
                      "--num_workers", str(args.num_workers), "--recall_k", "1", "5", "10", "--task", "zeroshot_retrieval"]
            peer_json = work / f"cb-{label}.json"
            peer = timed([str(BIN / "clip_benchmark"), "eval", "--model", args.model, "--pretrained", str(ckpt),
                          "--no_amp", *common, "--output", str(peer_json)], work)
            serial = None
            if args.parity:
                serial_json = work / f"cb-{label}-w0.json"
                serial_common = [*common[:common.index("--num_workers")], "--num_workers", "0",
                                 *common[common.index("--num_workers") + 2:]]
                timed([str(BIN / "clip_benchmark"), "eval", "--model", args.model, "--pretrained", str(ckpt),
                       "--no_amp", *serial_common, "--output", str(serial_json)], work)
                serial = json.loads(serial_json.read_text())["metrics"]
            runs = {}
            for variant, extra in ((v, variants[v]) for v in chosen):
                out = work / f"out-{label}-{variant}"
                runs[variant] = timed([str(BIN / "clipcache"), "eval", "--model", args.model, "--pretrained",
                                       str(ckpt), *common, *extra, "--output_dir", str(out), "--cache_dir",
                                       str(work / f"cache-{label}-{variant}"), "--quiet"], work)
                runs[variant] += (json.loads(next(out.rglob("*.json")).read_text())["metrics"],)
            theirs = json.loads(peer_json.read_text())["metrics"]
            print(f"\n{label}: {n} images, {3 * n} captions ({n_texts} distinct), {args.model} random weights, "
                  f"batch {args.batch_size}, {args.num_workers} workers")
            print(f"  clip_benchmark --no_amp  {peer[0]:7.1f} s  peak RSS {peer[1]:.2f} GB")
            names = {"fp32": "clipcache fp32", "amp": "clipcache --amp"}
            for variant in chosen:
                seconds, rss, metrics = runs[variant]
                diff = max(abs(metrics[k] - v) for k, v in theirs.items())
                print(f"  {names[variant]:<24} {seconds:7.1f} s  peak RSS {rss:.2f} GB  {peer[0] / seconds:.2f}x "
                      f"clip_benchmark's fp32 speed; largest recall@k difference {diff:.4f}")
                if serial is not None:
                    print(f"  {'':<24} against clip_benchmark --num_workers 0: largest recall@k difference "
                          f"{max(abs(metrics[k] - v) for k, v in serial.items()):.4f}")
            if serial is not None:
                print(f"  clip_benchmark itself, --num_workers 0 against {args.num_workers}: largest recall@k "
                      f"difference {max(abs(serial[k] - v) for k, v in theirs.items()):.4f}")


if __name__ == "__main__":
    main()
