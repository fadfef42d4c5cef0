"""Every Prefect flow clipcache defines, in one place: ``evaluate`` and ``rescore`` (the pipeline,
orchestration/pipeline.py), ``convert`` (orchestration/conversion.py), ``report`` (orchestration/reporting.py) and
``evaluate-suite`` (the nightly deployment's flow, reading a suite file: orchestration/deployments.py), each with every
stage a task run (``PrefectStages``).

Each flow takes one validated parameter model (the deployments' parameter schema), publishes its results as
artifacts, and returns them. The shipped prefect.yaml's entrypoints name this module
(``clipcache.flows.orchestration.flows:evaluate_suite``, ...); the old ones (``clipcache.flows.orchestration.deployments``,
``clipcache.flows.report``, ``clipcache.flows.convert``, ``clipcache.flows.orchestration.flows``) still load, re-exported.
"""

from __future__ import annotations

import contextlib

from prefect import flow

from clipcache.flows.config.convert_params import ConvertParams
from clipcache.flows.config.params import EvaluateParams
from clipcache.flows.orchestration.artifacts import publish_conversion, publish_evaluation, publish_report
from clipcache.flows.orchestration.conversion import run_conversion
from clipcache.flows.orchestration.deployments import SuiteParams, load_suite, with_registry_options
from clipcache.flows.orchestration.pipeline import PairResult, run_evaluation
from clipcache.flows.orchestration.reporting import ReportParams, run_report
from clipcache.flows.orchestration.stages import PrefectStages
from clipcache.storage.errors import ClipcacheError

__all__ = ["ConvertParams", "EvaluateParams", "ReportParams", "SuiteParams", "convert", "evaluate", "evaluate_suite",
           "report", "rescore", "run_pairs"]


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


@flow(name="evaluate-suite", flow_run_name="suite-{params.suite}", validate_parameters=True, log_prints=False)
def evaluate_suite(params: SuiteParams) -> list[PairResult]:
    """Evaluate every (model, dataset) pair of a suite file: encode what the cache lacks, score, write results."""
    return run_pairs(load_suite(params.suite, params.overrides), cached_only=False)


# The parameter schema of evaluate, rescore and evaluate-suite deployments (the suite's overrides), and what their runs
# validate against, includes the options of tasks from installed plugins (the registry's models, read when this module
# is loaded by a deployment or worker). A plugin option declared unlike a built-in one leaves the plain models here, so
# that the other flows still load; every evaluate run, and `clipcache serve`, names the clash in one line.
for _flow in (evaluate, rescore, evaluate_suite):
    with contextlib.suppress(ClipcacheError):
        with_registry_options(_flow)


@flow(name="convert", flow_run_name="convert-{params.datasets[0]}", validate_parameters=True, log_prints=False)
def convert(params: ConvertParams) -> list[dict]:
    """Caption images into BEIR text-retrieval folders; returns evalscope-style result dicts."""
    results = run_conversion(params, PrefectStages())
    publish_conversion(results)
    return results


@flow(name="report", validate_parameters=True, log_prints=False)
def report(params: ReportParams) -> str:
    """Run `dbt build` (models, data tests, unit tests) and write the HTML report; returns its path."""
    path = run_report(params, PrefectStages())
    publish_report(path)
    return path
