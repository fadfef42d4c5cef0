"""An MIEB task through clipcache's cache (cold, then re-run) against mteb's own uncached run, side by side.

    .venv/bin/python benchmarks/mieb_runner.py [--images 2000] [--model tiny-shapes-clip] [--batch_size 64]

A local copy of mteb/cifar10 in the layout mteb loads from the hub (data/test-*.parquet: columns img and label, a
ClassLabel), holding generated shapes images and the shapes class names, evaluated as mteb's own CIFAR10ZeroShot:

- mteb: ``mteb.evaluate`` with the same model behind mteb's encoder protocol, no cache (model load included);
- cold: ``mieb:CIFAR10ZeroShot`` with an empty cache (model load, every image and class prompt encoded);
- re-run: the same again with a new session (no forward pass, the model never loaded);
- shared: ``mieb:CIFAR10Clustering`` next, over the same images (every image vector from the cold run's entry).

Every run loads the data through mteb's own ``load_data`` from the folder (after one untimed load: ``datasets``
converts the Parquet files to its Arrow cache once) and runs mteb's evaluator; the numbers must agree (printed).
mteb's run is timed the second time it runs in the process: the first pays the process's one-time costs (the first
model load, torch's first forward passes), which would otherwise be charged to whichever run came first.
Ratios are against mteb's run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from clipcache.storage.embedding_store import EmbeddingStore  # noqa: E402
from clipcache.storage.hashing import FileHashMemo  # noqa: E402
from clipcache.tasks.datasets.shapes import CLASSNAMES, load_shapes  # noqa: E402
from clipcache.tasks.encode.stage import ModelSession  # noqa: E402
from clipcache.tasks.evaluation import evaluate_one  # noqa: E402
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings  # noqa: E402
from clipcache.tasks.models.resolve import resolve_model  # noqa: E402
from clipcache.tasks.models.spec import ModelSpec  # noqa: E402


def write_cifar10_copy(root: Path, n: int) -> None:
    from datasets import ClassLabel, Dataset, Features, Image

    ds = load_shapes("bench", "zeroshot_classification", "test", None, size=n)
    table = Dataset.from_dict({"img": [ds.load_image(i) for i in range(n)], "label": [int(v) for v in ds.labels]},
                              features=Features({"img": Image(), "label": ClassLabel(names=list(CLASSNAMES))}))
    (root / "data").mkdir(parents=True)
    table.to_parquet(str(root / "data" / "test-00000-of-00001.parquet"))


def new_session(model: str) -> tuple[ModelSession, FileHashMemo]:
    memo = FileHashMemo(None)
    return ModelSession(resolve_model(ModelSpec(model_name=model), memo), torch.device("cpu"), amp=False,
                        precision="fp32"), memo


def mteb_own(model: str, root: Path, batch_size: int) -> tuple[float, float]:
    """(seconds, main score) of mteb.evaluate with the model uncached."""
    import mteb

    from clipcache.tasks.datasets.mieb.mieb_tasks import load_mieb
    from clipcache.tasks.encode.mteb_encoder import UncachedMtebEncoder, model_meta

    started = time.perf_counter()
    data = load_mieb("CIFAR10ZeroShot", root, "test", "en")
    session, _ = new_session(model)
    encoder = UncachedMtebEncoder(session.model, model_meta(f"clipcache/{model}", "uncached"))
    result = mteb.evaluate(encoder, data.task, cache=None, co2_tracker=False, show_progress_bar=False,
                           encode_kwargs={"batch_size": batch_size})
    return time.perf_counter() - started, float(result.task_results[0].scores["test"][0]["main_score"])


def ours(model: str, task: str, root: Path, cache: Path, batch_size: int) -> tuple[float, float, int]:
    """(seconds, main score, model loads) of mieb:<task> through the cache."""
    started = time.perf_counter()
    session, memo = new_session(model)
    scored = evaluate_one("mieb", session, DataSource(f"mieb:{task}", str(root)), EmbeddingStore(cache), memo,
                          encode=EncodeSettings(batch_size, 0))
    return time.perf_counter() - started, scored.metrics["mteb_main_score"], session.loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--model", default="tiny-shapes-clip")
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args()
    import mteb  # noqa: F401 (imported once, before any timing: about 10 s on a loaded 2-core machine)

    with tempfile.TemporaryDirectory() as tmp:
        root, cache = Path(tmp) / "cifar10", Path(tmp) / "cache"
        write_cifar10_copy(root, args.images)
        from clipcache.tasks.datasets.mieb.mieb_tasks import load_mieb

        load_mieb("CIFAR10ZeroShot", root, "test", "en")  # datasets' one-time Parquet -> Arrow conversion, untimed
        print(f"{args.images} images, model {args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads")
        mteb_own(args.model, root, args.batch_size)  # untimed: the process's first model load and forward passes
        base, reference = mteb_own(args.model, root, args.batch_size)
        cold, cold_score, cold_loads = ours(args.model, "CIFAR10ZeroShot", root, cache, args.batch_size)
        warm, warm_score, warm_loads = ours(args.model, "CIFAR10ZeroShot", root, cache, args.batch_size)
        shared, nmi, shared_loads = ours(args.model, "CIFAR10Clustering", root, cache, args.batch_size)
        print(f"{'run':<34}{'seconds':>9}{'vs mteb':>9}  main score  model loads")
        for label, seconds, score, loads in (
                ("mteb.evaluate, uncached", base, reference, 1),
                ("mieb:CIFAR10ZeroShot, cold", cold, cold_score, cold_loads),
                ("mieb:CIFAR10ZeroShot, re-run", warm, warm_score, warm_loads),
                ("mieb:CIFAR10Clustering, same images", shared, nmi, shared_loads)):
            print(f"{label:<34}{seconds:9.2f}{base / seconds:8.1f}x  {score:10.4f}  {loads:>11}")
        print(f"accuracy equal to mteb's: {abs(cold_score - reference) < 1e-9 and warm_score == cold_score}")


if __name__ == "__main__":
    main()
