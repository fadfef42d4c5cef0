"""Same model, same data, fp32: our numbers equal LAION clip_benchmark 1.6.2's, computed by its own code.

clip_benchmark runs exactly as its CLI does for ``--dataset wds/... --no_amp`` (its wds builder, its dataloader, its
``evaluate`` functions); clipcache runs encode -> Zarr cache -> score. Accuracy and recall are compared for exact
equality; mAP (float32 sums in a different order) to 1e-6.
"""

from __future__ import annotations

import math

import open_clip
import pytest
import torch
from clip_benchmark.datasets.builder import build_dataset
from clip_benchmark.metrics import zeroshot_classification, zeroshot_retrieval

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import default_task
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, ScoreSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def clip_benchmark_metrics(model_dir, root, task, batch_size=16, recall_k=(1, 5, 10), device="cpu"):
    name = f"local-dir:{model_dir}"
    model, _, transform = open_clip.create_model_and_transforms(name, device=device)
    model.eval()
    tokenizer = open_clip.get_tokenizer(name)
    ds = build_dataset(dataset_name="wds/fixture", root=str(root), transform=transform, split="test",
                       download=False, task=task)
    loader = torch.utils.data.DataLoader(ds.batched(batch_size), batch_size=None, shuffle=False, num_workers=0)
    if task == "zeroshot_retrieval":
        return zeroshot_retrieval.evaluate(model, loader, tokenizer, device, amp=False, recall_k_list=list(recall_k))
    return zeroshot_classification.evaluate(model, loader, tokenizer, ds.classes, ds.templates, device, amp=False)


def clipcache_scored(tmp_path, root, batch_size=16, recall_k=(1, 5, 10), num_workers=2, ties=None, device="cpu"):
    memo = FileHashMemo(None)
    resolved = resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo)
    session = ModelSession(resolved, torch.device(device), amp=False, precision="fp32")
    return evaluate_one(default_task("wds/fixture", str(root)), session, DataSource("wds/fixture", str(root)),
                        EmbeddingStore(tmp_path / f"cache-{device}"), memo,
                        encode=EncodeSettings(batch_size, num_workers),
                        score=ScoreSettings(recall_k=tuple(recall_k), batch_size=batch_size, device=device),
                        options={"ties": ties} if ties else None)


def clipcache_metrics(tmp_path, root, batch_size=16, recall_k=(1, 5, 10), num_workers=2, device="cpu"):
    return clipcache_scored(tmp_path, root, batch_size, recall_k, num_workers, device=device).metrics


def assert_same(ours, theirs, tolerance=0.0):
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(ours[key]), key
        elif tolerance:
            assert ours[key] == pytest.approx(value, abs=tolerance), key
        else:
            assert ours[key] == value, key


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_classification_30_classes(tmp_path, tiny_model_dir, wds_classification, device):
    theirs = clip_benchmark_metrics(tiny_model_dir, wds_classification, "zeroshot_classification", device=device)
    assert_same(clipcache_metrics(tmp_path, wds_classification, device=device), theirs)
    assert theirs["acc1"] > 0.3  # a trained model, far above chance (1/30)


def test_classification_below_five_classes(tmp_path, tiny_model_dir):
    from conftest import write_wds

    root = write_wds(tmp_path / "four", "classification", 24, shards=2, n_classes=4)
    theirs = clip_benchmark_metrics(tiny_model_dir, root, "zeroshot_classification")
    assert math.isnan(theirs["acc5"])
    assert_same(clipcache_metrics(tmp_path, root), theirs)


@pytest.mark.parametrize("device", DEVICES)
def test_retrieval_with_several_captions_per_image(tmp_path, tiny_model_dir, wds_retrieval, device):
    theirs = clip_benchmark_metrics(tiny_model_dir, wds_retrieval, "zeroshot_retrieval", device=device)
    assert_same(clipcache_metrics(tmp_path, wds_retrieval, device=device), theirs)


def test_multilabel_mean_average_precision(tmp_path, tiny_model_dir, wds_multilabel):
    theirs = clip_benchmark_metrics(tiny_model_dir, wds_multilabel, "zeroshot_classification")
    assert_same(clipcache_metrics(tmp_path, wds_multilabel), theirs, tolerance=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_retrieval_with_repeated_captions_equals_clip_benchmarks_topk_choice(tmp_path, tiny_model_dir, device):
    """600 shapes images whose captions repeat (same colour, shape, size, position and background): exact score ties
    across the cut-off, decided by torch.topk in clip_benchmark; the default rule reproduces its choice, and the
    run reports how many queries such a tie decided."""
    from conftest import write_wds

    root = write_wds(tmp_path / "ties", "retrieval", 600, shards=2, fmt="png")
    theirs = clip_benchmark_metrics(tiny_model_dir, root, "zeroshot_retrieval", batch_size=64, device=device)
    ours = clipcache_scored(tmp_path, root, batch_size=64, device=device)
    assert_same(ours.metrics, theirs)
    assert sum(ours.tied.values()) > 0  # the data has ties that topk decides
    stable = clipcache_scored(tmp_path, root, batch_size=64, ties="stable", device=device).metrics
    if device == "cpu":  # ... and on the CPU the stable rule decides them otherwise, as documented. CUDA's topk
        # happened to pick the lowest index among these ties on an H100 (torch 2.11): the same recall@k both ways.
        assert stable != theirs
