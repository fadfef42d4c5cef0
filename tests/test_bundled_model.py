"""The shipped tiny model meets its targets on held-out shapes; the training script still runs (a few steps)."""

from __future__ import annotations

import subprocess
import sys

import torch

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import default_task
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, ScoreSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

from conftest import REPO


def evaluate_bundled(tmp_path, name):
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"), False,
                           "fp32")
    scored = evaluate_one(default_task(name, None), session, DataSource(name), EmbeddingStore(tmp_path), memo,
                          encode=EncodeSettings(128, 2), score=ScoreSettings(recall_k=(5,)))
    return scored.metrics, scored.n_samples


def test_held_out_classification_over_30_classes(tmp_path):
    metrics, n = evaluate_bundled(tmp_path, "shapes")
    assert n == 1200 and metrics["acc1"] >= 0.9


def test_held_out_retrieval_recall_at_5_both_ways(tmp_path):
    metrics, _ = evaluate_bundled(tmp_path, "shapes_retrieval")
    assert metrics["image_retrieval_recall@5"] >= 0.8 and metrics["text_retrieval_recall@5"] >= 0.8


def test_training_script_smoke(tmp_path):
    out = tmp_path / "model"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "train_tiny_model.py"), "--steps", "2",
                           "--pool_size", "64", "--batch_size", "16", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    resolved = resolve_model(ModelSpec(model_name=f"local-dir:{out}"), FileHashMemo(None))
    assert resolved.loader == "open_clip" and (out / "open_clip_model.safetensors").stat().st_size > 1_000_000
