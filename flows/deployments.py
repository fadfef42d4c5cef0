"""Compatibility: the ``evaluate-suite`` flow (older prefect.yaml files' entrypoint
``clipcache.flows.deployments:evaluate_suite``) lives in clipcache.flows.orchestration.flows; serving the deployments
in clipcache.flows.orchestration.deployments."""

from clipcache.flows.orchestration.deployments import SuiteParams, load_suite, serve_deployments
from clipcache.flows.orchestration.flows import evaluate_suite

__all__ = ["SuiteParams", "evaluate_suite", "load_suite", "serve_deployments"]
