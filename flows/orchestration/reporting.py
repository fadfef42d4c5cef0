"""Reporting: dbt builds the marts over the Parquet results, then a static HTML report is rendered; or, with
``compare``, pages of the samples two experiments (or models) disagree on."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from clipcache.flows.config.params import local_folder
from clipcache.flows.orchestration.stages import Stages
from clipcache.tasks.report.dbt_build import dbt_build
from clipcache.tasks.report.html import render_report


class ReportParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output_dir: str = "outputs"
    # default: <output_dir>/report/index.html; with `compare`, the folder of pages
    # (default <output_dir>/report/compare/<A>-vs-<B>)
    report_path: str | None = None
    compare: tuple[str, str] | None = Field(None, description="two experiments or models (as `clipcache compare` "
                                                              "takes them): pages of the samples that flipped")
    max_flips: int = Field(50, ge=1, description="flips listed each way per dataset (all are counted)")

    @field_validator("output_dir")
    @classmethod
    def _local(cls, value: str) -> str:
        return local_folder(value)

    @model_validator(mode="after")
    def _outside_the_results(self) -> ReportParams:
        """The page must not land on (or among) the result files it reports on."""
        from clipcache.storage.errors import ConfigError
        from clipcache.storage.warehouse import check_export_path
        from clipcache.tasks.report.compare_report import check_compare_folder

        if self.report_path is not None:
            try:
                if self.compare:
                    check_compare_folder(self.report_path, self.output_dir, flag="report_path")
                else:
                    check_export_path(self.report_path, self.output_dir, flag="report_path")
            except ConfigError as e:
                raise ValueError(str(e)) from e
        return self


def run_report(params: ReportParams, stages: Stages) -> str:
    """Run `dbt build` (models, data tests, unit tests) and write the HTML report; returns its path. With
    ``compare``: the comparison pages instead (no dbt); returns their index."""
    from clipcache.tasks.progress import StageProgress
    from clipcache.tasks.report.compare_report import write_compare_report

    if params.compare:
        baseline, candidate = params.compare
        with StageProgress().status(f"comparison pages: {candidate} vs {baseline}"):
            return str(stages.run("compare-pages", f"compare-pages-{baseline}-vs-{candidate}", write_compare_report,
                                  params.output_dir, baseline, candidate, params.report_path,
                                  max_flips=params.max_flips))
    with StageProgress().status("dbt build: models, data tests, unit tests"):
        database = stages.run("dbt-build", "dbt-build", dbt_build, params.output_dir)
    out = Path(params.report_path) if params.report_path else Path(params.output_dir) / "report" / "index.html"
    return str(stages.run("render-html", "render-html", render_report, database, out))
