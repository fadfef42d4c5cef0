"""The ``convert`` Prefect flow (the deployments' entry point): flows/conversion.py with every stage a task run."""

from __future__ import annotations

from prefect import flow

from clipcache.flows.artifacts import publish_conversion
from clipcache.flows.conversion import run_conversion
from clipcache.flows.convert_params import ConvertParams
from clipcache.flows.stages import PrefectStages


@flow(name="convert", flow_run_name="convert-{params.datasets[0]}", validate_parameters=True, log_prints=False)
def convert(params: ConvertParams) -> list[dict]:
    """Caption images into BEIR text-retrieval folders; returns evalscope-style result dicts."""
    results = run_conversion(params, PrefectStages())
    publish_conversion(results)
    return results
