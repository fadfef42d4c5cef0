"""Reporting: dbt builds the marts over the Parquet results, then a static HTML report is rendered."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from clipcache.flows.params import local_folder
from clipcache.flows.stages import Stages
from clipcache.tasks.report.dbt_build import dbt_build
from clipcache.tasks.report.html import render_report


class ReportParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output_dir: str = "outputs"
    report_path: str | None = None  # default: <output_dir>/report/index.html

    @field_validator("output_dir")
    @classmethod
    def _local(cls, value: str) -> str:
        return local_folder(value)

    @model_validator(mode="after")
    def _outside_the_results(self) -> ReportParams:
        """The page must not land on (or among) the result files it reports on."""
        from clipcache.storage.errors import ConfigError
        from clipcache.storage.warehouse import check_export_path

        if self.report_path is not None:
            try:
                check_export_path(self.report_path, self.output_dir, flag="report_path")
            except ConfigError as e:
                raise ValueError(str(e)) from e
        return self


def run_report(params: ReportParams, stages: Stages) -> str:
    """Run `dbt build` (models, data tests, unit tests) and write the HTML report; returns its path."""
    from clipcache.tasks.progress import StageProgress

    with StageProgress().status("dbt build: models, data tests, unit tests"):
        database = stages.run("dbt-build", "dbt-build", dbt_build, params.output_dir)
    out = Path(params.report_path) if params.report_path else Path(params.output_dir) / "report" / "index.html"
    return str(stages.run("render-html", "render-html", render_report, database, out))
