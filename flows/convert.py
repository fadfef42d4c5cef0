"""Compatibility: the ``convert`` flow (older prefect.yaml files' entrypoint ``clipcache.flows.convert:convert``)
lives in clipcache.flows.orchestration.flows."""

from clipcache.flows.orchestration.flows import convert

__all__ = ["convert"]
