"""Compatibility: the ``report`` flow (older prefect.yaml files' entrypoint ``clipcache.flows.report:report``)
lives in clipcache.flows.orchestration.flows."""

from clipcache.flows.orchestration.flows import ReportParams, report

__all__ = ["ReportParams", "report"]
