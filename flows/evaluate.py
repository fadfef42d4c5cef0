"""Compatibility: the ``evaluate`` and ``rescore`` flows live in clipcache.flows.orchestration.flows."""

from clipcache.flows.orchestration.flows import evaluate, rescore, run_pairs

__all__ = ["evaluate", "rescore", "run_pairs"]
