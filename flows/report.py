"""The ``report`` flow: dbt builds the marts over the Parquet results, then a static HTML report is rendered."""

from __future__ import annotations

from pathlib import Path

from clipcache.flows import runtime

runtime.configure()

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from pydantic import BaseModel, ConfigDict, field_validator  # noqa: E402

from clipcache.flows.artifacts import publish_report  # noqa: E402
from clipcache.flows.params import local_folder  # noqa: E402
from clipcache.tasks.report.dbt_build import dbt_build  # noqa: E402
from clipcache.tasks.report.html import render_report  # noqa: E402


class ReportParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output_dir: str = "outputs"
    report_path: str | None = None  # default: <output_dir>/report/index.html

    @field_validator("output_dir")
    @classmethod
    def _local(cls, value: str) -> str:
        return local_folder(value)


build_marts = task(dbt_build, name="dbt-build", cache_policy=NO_CACHE)
render = task(render_report, name="render-html", cache_policy=NO_CACHE)


@flow(name="report", validate_parameters=True, log_prints=False)
def report(params: ReportParams) -> str:
    """Run `dbt build` (models, data tests, unit tests) and write the HTML report; returns its path."""
    database = build_marts(params.output_dir)
    out = Path(params.report_path) if params.report_path else Path(params.output_dir) / "report" / "index.html"
    path = str(render(database, out))
    publish_report(path)
    return path
