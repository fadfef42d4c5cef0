"""The ``evaluate`` and ``rescore`` Prefect flows: the pipeline (flows/pipeline.py) with every stage a task run.

Each flow takes one validated parameter model (the deployments' parameter schema), names its run after its first
dataset, publishes its metrics table and summary as artifacts, and returns one result per (model, dataset, language).
"""

from __future__ import annotations

from prefect import flow

from clipcache.flows.artifacts import publish_evaluation
from clipcache.flows.params import EvaluateParams
from clipcache.flows.pipeline import PairResult, run_evaluation
from clipcache.flows.stages import PrefectStages


def run_pairs(params: EvaluateParams, cached_only: bool) -> list[PairResult]:
    outcome = run_evaluation(params, PrefectStages(), cached_only)
    publish_evaluation("rescore" if cached_only else "evaluate", outcome.run_id, outcome.results, params.output_dir)
    return outcome.results


@flow(name="evaluate", flow_run_name="evaluate-{params.datasets[0]}", validate_parameters=True, log_prints=False)
def evaluate(params: EvaluateParams) -> list[PairResult]:
    """Encode what the cache lacks, then score every (model, dataset, language)."""
    return run_pairs(params, cached_only=False)


@flow(name="rescore", flow_run_name="rescore-{params.datasets[0]}", validate_parameters=True, log_prints=False)
def rescore(params: EvaluateParams) -> list[PairResult]:
    """Recompute metrics from cached embeddings only: never decodes an image; loads the model only to encode class
    prompts it has never seen (new templates or class names), and says which `clipcache eval` fills any gap."""
    return run_pairs(params, cached_only=True)
