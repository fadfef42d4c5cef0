"""The ``report`` Prefect flow (the deployments' entry point): flows/reporting.py with every stage a task run."""

from __future__ import annotations

from prefect import flow

from clipcache.flows.artifacts import publish_report
from clipcache.flows.reporting import ReportParams, run_report
from clipcache.flows.stages import PrefectStages

__all__ = ["ReportParams", "report"]


@flow(name="report", validate_parameters=True, log_prints=False)
def report(params: ReportParams) -> str:
    """Run `dbt build` (models, data tests, unit tests) and write the HTML report; returns its path."""
    path = run_report(params, PrefectStages())
    publish_report(path)
    return path
