"""Encode throughput: clipcache's encode stage vs a plain hand-written open_clip loop, side by side in one run.

    .venv/bin/python benchmarks/encode_throughput.py [--images 512] [--batch_size 64] [--num_workers 2]

Both sides decode the same JPEG images from webdataset shards, apply the model's own preprocessing and run a random
ViT-B-32 (fp32, seeded) on the CPU; clipcache additionally writes the vectors to the Zarr cache. Prints images/s for
each, their ratio (target >= 1.0), and images/s with --amp (bf16 autocast on CPU). Order alternates to spread noise.
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402
from clipcache.storage.hashing import FileHashMemo  # noqa: E402
from clipcache.tasks.contract import EncodeSettings  # noqa: E402
from clipcache.tasks.datasets import open_dataset  # noqa: E402
from clipcache.tasks.datasets.shapes import load_shapes  # noqa: E402
from clipcache.tasks.encode.stage import ModelSession, encode_images, image_key_fields  # noqa: E402
from clipcache.tasks.models.resolve import resolve_model  # noqa: E402
from clipcache.tasks.models.spec import ModelSpec  # noqa: E402
from clipcache.tasks.progress import StageProgress  # noqa: E402


def write_shards(root: Path, n: int, shards: int = 4) -> Path:
    ds = load_shapes("bench", "zeroshot_classification", "test", n)
    (root / "test").mkdir(parents=True)
    per = -(-n // shards)
    for s in range(shards):
        with tarfile.open(root / "test" / f"{s}.tar", "w") as tar:
            for i in range(s * per, min(n, (s + 1) * per)):
                buf = io.BytesIO()
                # 224 px JPEGs, so decoding and resizing cost what they cost on real photos.
                ds.load_image(i).resize((256, 256), Image.BICUBIC).save(buf, format="JPEG", quality=90)
                for name, data in ((f"{i:06d}.jpg", buf.getvalue()), (f"{i:06d}.cls", str(int(ds.labels[i])).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    (root / "test" / "nshards.txt").write_text(str(shards))
    (root / "classnames.txt").write_text("\n".join(f"c{i}" for i in range(30)))
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\n")
    return root


def plain_loop(root: Path, batch_size: int) -> tuple[float, np.ndarray]:
    """What one writes by hand: read tar members in order, preprocess, encode, normalise."""
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32")
    model.eval()
    start = time.perf_counter()
    images = []
    for shard in sorted((root / "test").glob("*.tar"), key=lambda p: int(p.stem)):
        with tarfile.open(shard) as tar:
            images += [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")]
    out = []
    with torch.inference_mode():
        for lo in range(0, len(images), batch_size):
            batch = torch.stack([preprocess(Image.open(io.BytesIO(b)).convert("RGB"))
                                 for b in images[lo:lo + batch_size]])
            out.append(F.normalize(model.encode_image(batch), dim=-1).numpy())
    return time.perf_counter() - start, np.concatenate(out)


def clipcache_encode(root: Path, batch_size: int, num_workers: int, amp: bool) -> tuple[float, np.ndarray]:
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="ViT-B-32"), memo), torch.device("cpu"), amp,
                           "amp_bf16" if amp else "fp32")
    _ = session.model  # load outside the timed region, as the plain loop does
    ds = open_dataset("wds/bench", str(root), "test", None)
    with tempfile.TemporaryDirectory() as cache:
        store = EmbeddingStore(cache)
        start = time.perf_counter()
        out = encode_images(session, ds, store, image_key_fields(session, ds.identity(memo), "test", None),
                            EncodeSettings(batch_size, num_workers, "error"), StageProgress(enabled=False))
        seconds = time.perf_counter() - start
        return seconds, store.open(out.ref.key).embeddings()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = write_shards(Path(tmp) / "wds", args.images)
        plain, ours = [], []
        for r in range(args.repeats):  # alternate order so drift in machine load hits both sides
            runs = [("plain", plain_loop, (root, args.batch_size)),
                    ("ours", clipcache_encode, (root, args.batch_size, args.num_workers, False))]
            for name, fn, fn_args in (runs if r % 2 == 0 else runs[::-1]):
                seconds, emb = fn(*fn_args)
                (plain if name == "plain" else ours).append((seconds, emb))
        np.testing.assert_allclose(ours[0][1], plain[0][1], atol=1e-5)  # same vectors, so the same work
        amp_seconds, _ = clipcache_encode(root, args.batch_size, args.num_workers, True)
    best_plain = min(s for s, _ in plain)
    best_ours = min(s for s, _ in ours)
    n = args.images
    print(f"ViT-B-32 random weights, {n} JPEG images, batch {args.batch_size}, {torch.get_num_threads()} threads")
    print(f"plain open_clip loop : {n / best_plain:7.1f} images/s ({best_plain:.1f} s, best of {args.repeats})")
    print(f"clipcache encode fp32: {n / best_ours:7.1f} images/s ({best_ours:.1f} s, best of {args.repeats}, "
          f"{args.num_workers} decode threads, includes the Zarr write)")
    print(f"ratio clipcache / plain: {best_plain / best_ours:.2f}x  (target >= 1.0)")
    print(f"clipcache encode --amp (bf16 autocast): {n / amp_seconds:7.1f} images/s "
          f"({best_ours / amp_seconds:.2f}x fp32)")


if __name__ == "__main__":
    main()
